"""The registry of on-disk formats (broker/formats.py) and the start-up check over it
(broker/format_check.py), on files in a temporary directory: what is refused, with what
message, that a refusal changes nothing, and that an upgrade cut short finishes at the next
start."""

import json
import os
import re
from pathlib import Path

import pytest

from broker.cli import main as broker_main
from broker.cluster import versions
from broker.ds import files
from broker.format_check import FormatRefused, inspect, record_cluster_version, upgrade
from broker.formats import (
    BY_NAME,
    DATA_DIR,
    FORMATS,
    STAMP,
    WAL,
    WAL_DIR,
    in_tree,
    stamp_of,
    wal_segment_header,
)
from broker.raft import wal
from broker.version import RELEASE
from tests.support.releases import releases
from tests.support.tree import state


def _trees(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "data", tmp_path / "data" / "raft" / "wal"


def _stamp(root: Path, doc: object) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / STAMP).write_text(json.dumps(doc))


def _open(tmp_path: Path) -> list[tuple[Path, str]]:
    data_dir, wal_dir = _trees(tmp_path)
    return upgrade(data_dir, wal_dir, inspect(data_dir, wal_dir))


def test_every_format_names_who_reads_each_of_its_versions() -> None:
    known = {*releases(), RELEASE}
    assert len(BY_NAME) == len(FORMATS)
    for fmt in FORMATS:
        assert fmt.tree in (DATA_DIR, WAL_DIR)
        assert fmt.version >= 1 and set(fmt.read_by) <= known, fmt
    assert {fmt.tree for fmt in FORMATS} == {DATA_DIR, WAL_DIR}


def test_the_write_ahead_log_writes_the_header_the_registry_names() -> None:
    assert wal.MAGIC == wal_segment_header() == b"RAFTWAL%d" % WAL.version


def test_a_tree_without_stamps_is_version_0_and_is_stamped_once(tmp_path: Path) -> None:
    data_dir, wal_dir = _trees(tmp_path)
    found = inspect(data_dir, wal_dir)
    assert {(item.fmt.name, item.version) for item in found} == {
        (fmt.name, 0) for fmt in FORMATS}
    assert not data_dir.exists()  # looking changes nothing
    assert [stamp for stamp, _ in upgrade(data_dir, wal_dir, found)] == [
        data_dir / STAMP, wal_dir / STAMP]
    assert json.loads((data_dir / STAMP).read_text()) == stamp_of(DATA_DIR)
    assert json.loads((wal_dir / STAMP).read_text()) == stamp_of(WAL_DIR)
    assert {(item.fmt.name, item.version) for item in inspect(data_dir, wal_dir)} == {
        (fmt.name, fmt.version) for fmt in FORMATS}
    before = state(tmp_path)
    assert _open(tmp_path) == []
    assert state(tmp_path) == before


def test_a_format_newer_than_this_release_is_refused_naming_file_version_and_release(
        tmp_path: Path) -> None:
    data_dir, _ = _trees(tmp_path)
    doc = stamp_of(DATA_DIR)
    doc["formats"]["sessions"] = {"version": 2, "read_by": "0.3.0"}
    _stamp(data_dir, doc)
    before = state(tmp_path)
    with pytest.raises(FormatRefused) as refused:
        _open(tmp_path)
    message = str(refused.value)
    assert str(data_dir / STAMP) in message and "sessions" in message
    assert "version 2" in message and "release 0.3.0" in message and RELEASE in message
    assert state(tmp_path) == before


def test_a_format_this_release_does_not_know_is_refused(tmp_path: Path) -> None:
    _, wal_dir = _trees(tmp_path)
    doc = stamp_of(WAL_DIR)
    doc["formats"]["wal-index"] = {"version": 1, "read_by": "0.4.0"}
    _stamp(wal_dir, doc)
    with pytest.raises(FormatRefused, match=r"wal-index, which this release does not know.*"
                                            r"release 0\.4\.0"):
        _open(tmp_path)


@pytest.mark.parametrize(("content", "reason"), [
    (b"\x00\x17garbage", "not JSON"),
    (b'{"formats": {}}', "no \"kind\""),
    (b'["mqtt-broker-formats"]', "no \"kind\""),
    (json.dumps({"kind": "mqtt-broker-formats", "formats": {"wal": {"version": "1"}}}
                ).encode(), "is not a map"),
    (b"", "not JSON"),
], ids=["garbage", "foreign-json", "not-an-object", "bad-version", "empty"])
def test_a_stamp_that_is_not_ours_is_refused_and_left_alone(
        tmp_path: Path, content: bytes, reason: str) -> None:
    _, wal_dir = _trees(tmp_path)
    wal_dir.mkdir(parents=True)
    (wal_dir / STAMP).write_bytes(content)
    before = state(tmp_path)
    with pytest.raises(FormatRefused) as refused:
        _open(tmp_path)
    assert str(wal_dir / STAMP) in str(refused.value) and reason in str(refused.value)
    assert state(tmp_path) == before


def _segments(wal_dir: Path, *heads: bytes) -> None:
    wal_dir.mkdir(parents=True, exist_ok=True)
    for i, head in enumerate(heads):
        (wal_dir / f"{i:016x}.wal").write_bytes(head)


@pytest.mark.parametrize(("heads", "bad", "reason"), [
    ((b"RAFTWAL1", b"RAFTWAL2\x00\x00"), 1, "segment of version 2"),
    ((b"RAFT", b"RAFTWAL1"), 0, "4 bytes, shorter than a segment's header"),
    ((b"PK\x03\x04junk", b"RAFTWAL1"), 0, "does not start with RAFTWAL<version>"),
    ((b"RAFTWAL0",), 0, "does not start with RAFTWAL<version>"),
], ids=["newer", "truncated-header", "foreign", "version-0"])
def test_a_segment_this_release_cannot_read_is_refused(
        tmp_path: Path, heads: tuple[bytes, ...], bad: int, reason: str) -> None:
    _, wal_dir = _trees(tmp_path)
    _segments(wal_dir, *heads)
    before = state(tmp_path)
    with pytest.raises(FormatRefused) as refused:
        _open(tmp_path)
    assert str(wal_dir / f"{bad:016x}.wal") in str(refused.value)
    assert reason in str(refused.value)
    assert state(tmp_path) == before


def test_a_last_segment_cut_short_at_creation_is_left_to_recovery(tmp_path: Path) -> None:
    _, wal_dir = _trees(tmp_path)
    _segments(wal_dir, b"RAFTWAL1" + b"\x00" * 16, b"RAF")
    _open(tmp_path)
    assert (wal_dir / STAMP).is_file()


def test_an_upgrade_cut_short_after_its_first_stamp_finishes_at_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash between the two stamps (and with a stamp's temporary file half written):
    the data dir's written, the write-ahead log's not (they are written side by side)."""
    data_dir, wal_dir = _trees(tmp_path)
    _segments(wal_dir, b"RAFTWAL1")
    written: list[Path] = []
    real = files.write_atomically

    def crash_on_the_wal_stamp(path: Path, data: bytes) -> None:
        if path == wal_dir / STAMP:
            path.with_name(path.name + ".tmp").write_bytes(data[:10])
            raise SystemExit("killed")
        written.append(path)
        real(path, data)

    monkeypatch.setattr(files, "write_atomically", crash_on_the_wal_stamp)
    with pytest.raises(SystemExit):
        _open(tmp_path)
    assert written == [data_dir / STAMP] and not (wal_dir / STAMP).exists()
    monkeypatch.setattr(files, "write_atomically", real)
    assert [stamp for stamp, _ in _open(tmp_path)] == [wal_dir / STAMP]
    assert {item.version for item in inspect(data_dir, wal_dir)} == {1}
    assert not (wal_dir / (STAMP + ".tmp")).exists()


def test_a_stamp_of_an_older_version_is_brought_up_to_this_release(tmp_path: Path) -> None:
    """A stamp that lacks a format (a release before it existed) or holds an older version
    is rewritten with this release's versions; the formats it names stay readable."""
    data_dir, _ = _trees(tmp_path)
    doc = stamp_of(DATA_DIR)
    del doc["formats"]["api-key"]
    doc["formats"]["sessions"]["version"] = 0
    _stamp(data_dir, doc)
    assert _open(tmp_path) == [(data_dir / STAMP, "sessions 0->1, api-key 0->1"),
                               (_trees(tmp_path)[1] / STAMP, "wal 0->1")]
    assert len(in_tree(DATA_DIR)) == len(json.loads((data_dir / STAMP).read_text())["formats"])


def test_the_cluster_version_is_recorded_kept_and_refused_when_this_code_cannot_run_it(
        tmp_path: Path) -> None:
    """A node whose cluster rose beyond the versions this code runs (a downgrade after a
    rise) is refused at start-up, before it replays a log with entries it would skip."""
    data_dir, _ = _trees(tmp_path)
    _open(tmp_path)
    record_cluster_version(data_dir, 0)  # nothing above what is recorded (none: 0)
    assert "cluster" not in json.loads((data_dir / STAMP).read_text())
    record_cluster_version(data_dir, versions.HIGHEST)
    record_cluster_version(data_dir, 1)  # never lower
    doc = json.loads((data_dir / STAMP).read_text())
    assert doc == {**stamp_of(DATA_DIR), "cluster": {
        "version": versions.HIGHEST, "run_by": versions.RUN_BY[versions.HIGHEST]}}
    assert _open(tmp_path) == []  # this code runs it
    # A later release bumps a format: its stamp keeps the version.
    doc["formats"]["sessions"]["version"] = 0
    _stamp(data_dir, doc)
    _open(tmp_path)
    assert json.loads((data_dir / STAMP).read_text())["cluster"] == doc["cluster"]

    doc["cluster"] = {"version": versions.HIGHEST + 1, "run_by": "0.4.0"}
    _stamp(data_dir, doc)
    before = state(tmp_path)
    with pytest.raises(FormatRefused) as refused:
        _open(tmp_path)
    assert str(refused.value) == (
        f"{data_dir / STAMP}: this node's cluster runs cluster version {versions.HIGHEST + 1},"
        f" which release 0.4.0 and later run; this is release {RELEASE}, which runs up to"
        f" version {versions.HIGHEST} (a cluster's version never falls). Run release 0.4.0"
        f" or later on this data dir; nothing was changed")
    assert state(tmp_path) == before


def test_every_cluster_version_names_the_first_release_that_runs_it() -> None:
    assert len(versions.RUN_BY) == versions.HIGHEST + 1
    assert set(versions.RUN_BY) <= {*releases(), RELEASE}


@pytest.mark.parametrize("cluster", [{"version": "2", "run_by": "0.2.0"}, {"version": 1},
                                     [1, "0.2.0"], {"version": -1, "run_by": "0.2.0"}])
def test_a_stamp_whose_cluster_version_is_not_ours_is_refused(
        tmp_path: Path, cluster: object) -> None:
    data_dir, _ = _trees(tmp_path)
    _stamp(data_dir, {**stamp_of(DATA_DIR), "cluster": cluster})
    with pytest.raises(FormatRefused, match=r'not a format stamp of this broker .*"cluster"'):
        _open(tmp_path)


def test_an_unreadable_stamp_is_refused_not_replaced(tmp_path: Path) -> None:
    data_dir, _ = _trees(tmp_path)
    (data_dir / STAMP).mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(FormatRefused, match="cannot read the format stamp"):
        _open(tmp_path)
    assert (data_dir / STAMP).is_dir() and os.listdir(data_dir / STAMP) == []


def test_the_documented_table_is_the_registry() -> None:
    """docs/formats.md lists every format with its tree and version, and no other."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|[^|]*\| (\d+) \|$", text, re.M)
    assert rows == [(fmt.name, fmt.tree, str(fmt.version)) for fmt in FORMATS]


def test_broker_formats_lists_what_a_data_dir_holds_without_changing_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir, wal_dir = _trees(tmp_path)
    _stamp(wal_dir, stamp_of(WAL_DIR))
    before = state(tmp_path)
    assert broker_main(["formats", "--data-dir", str(data_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["site", "0", "1"] and "(none: 0.1.0" in lines[1]
    assert lines[-1].split() == ["wal", "1", "1", str(wal_dir / STAMP)]
    doc = stamp_of(WAL_DIR)
    doc["formats"]["wal"]["version"] = 9
    _stamp(wal_dir, doc)
    assert broker_main(["formats", "--data-dir", str(data_dir)]) == 2
    assert "format wal" in capsys.readouterr().err
    assert state(tmp_path).keys() == before.keys()


def test_ctl_ds_info_refuses_to_open_a_newer_data_dir(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir, _ = _trees(tmp_path)
    (data_dir / "ds").mkdir(parents=True)
    doc = stamp_of(DATA_DIR)
    doc["formats"]["messages"] = {"version": 5, "read_by": "1.0.0"}
    _stamp(data_dir, doc)
    before = state(tmp_path)
    assert broker_main(["ctl", "ds", "info", "--data-dir", str(data_dir)]) == 1
    assert "format messages" in capsys.readouterr().err
    assert state(tmp_path) == before


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("ds/site_id", b"\x89\xffbinary", "can't decode"),
    ("ds/incarnation", b"", "not one line of text"),
    ("ds/messages/db.json", b"[16]", "not a JSON object"),
    ("ds/messages/db.json", b'{"n_shards": 1', "Expecting"),
    ("raft/metadata.json", b"\x00\x00\x00", "Expecting value"),
    ("cluster/members.json", "{\"members\": []}".encode("utf-16"), "can't decode"),
    ("cluster/cookie", b"one\ntwo\n", "not one line of text"),
    ("ds/messages/shard-003/gen-000002/manifest.json", b'{"format": 1, "shard": 3, "gen',
     "Unterminated string"),
])
def test_a_small_file_that_is_not_ours_is_refused_naming_it(
        tmp_path: Path, name: str, content: bytes, reason: str) -> None:
    data_dir, _ = _trees(tmp_path)
    (data_dir / name).parent.mkdir(parents=True)
    (data_dir / name).write_bytes(content)
    before = state(tmp_path)
    with pytest.raises(FormatRefused) as refused:
        _open(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{data_dir / name}: not the file of format ") and reason in message
    assert state(tmp_path) == before


def test_the_small_files_a_node_writes_pass(tmp_path: Path) -> None:
    data_dir, _ = _trees(tmp_path)
    for name, content in [("ds/site_id", "5c6028d6ce9459c7\n"), ("cluster/cookie", "c\n"),
                          ("ds/messages/db.json", '{"n_shards": 16, "format": 1}'),
                          ("ds/messages/shard-000/gen-000001/manifest.json", '{"format": 1}'),
                          # A replica's received files: not a slab's manifest.
                          ("ds/messages/shard-000.snapshot-files/gen-1/0001-manifest.json",
                           "half a fi")]:
        (data_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (data_dir / name).write_text(content)
    assert _open(tmp_path)[0][0] == data_dir / STAMP
