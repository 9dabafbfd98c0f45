"""Data dirs across releases (broker/formats.py, docs/formats.md), with real processes.

A data dir really written by release 0.1.0 (its code built from git, `RELEASES`) opens with
this tree: its durable session, the messages stored for it in a sealed and in the current
generation, and its retained message are all there, and it is stamped; a kill -9 between
the two stamps restarts cleanly. One from a newer release, or with a damaged stamp or
write-ahead log segment, or a site ID or JSON file not ours, is refused at start with a
message naming the file, and the refusal changes nothing, however often the node is started
again; so is one whose cluster rose to a version this code does not run.
"""

import json
import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.cluster import versions
from broker.formats import DATA_DIR, STAMP, WAL_DIR, stamp_of
from broker.version import RELEASE
from tests.integration.clients import NO_MATCHING_SUBSCRIBERS, PahoClient, wait_until
from tests.support import releases
from tests.support.broker_process import BrokerProcess
from tests.support.tree import state

# builtin_raft on one node: the WAL holds the metadata, sessions and shard groups' entries.
SETTINGS = {"durable_sessions.enable": "true",
            "durable_storage.messages.backend": "builtin_raft",
            "durable_storage.n_sites": "1", "durable_storage.messages.n_shards": "2"}
SESSION, TOPIC, RETAINED = "formats-durable", "formats/data", "formats/retained"
SENT = [b"m%d" % i for i in range(10)]


@pytest.fixture(scope="module")
def release_0_1_0_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data dir of a 0.1.0 node that took a durable session, ten messages stored for it
    (five of them then sealed in a generation) and a retained message, stopped by SIGTERM."""
    root = tmp_path_factory.mktemp("release-0.1.0")
    code = releases.build("0.1.0", root)
    node = BrokerProcess(root / "data", SETTINGS, code=code).start()
    clients: list[PahoClient] = []
    try:
        subscriber = PahoClient(node.tcp, SESSION)
        clients.append(subscriber)
        subscriber.connect(clean_start=False, session_expiry=3600)
        subscriber.subscribe(f"{TOPIC}/#", qos=1)
        subscriber.disconnect()
        publisher = PahoClient(node.tcp, "formats-publisher")
        clients.append(publisher)
        publisher.connect()
        for i, payload in enumerate(SENT):
            if i == 5:
                _seal(node)
            assert publisher.publish(f"{TOPIC}/{i}", payload, qos=1) == 0
        # Stored though no one subscribed (yet).
        assert publisher.publish(RETAINED, b"kept", qos=1,
                                 retain=True) == NO_MATCHING_SUBSCRIBERS
        wait_until(lambda: node.metric("mqtt_retained_messages") == 1, 10, "retained stored")
    finally:
        for client in clients:
            client.close()
        assert node.stop() == 0
    assert not (root / "data" / STAMP).exists()  # 0.1.0 wrote no stamps
    return root / "data"


def _seal(node: BrokerProcess) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{node.ports['http']}/api/v5/ds/storages/messages/generations",
        method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


@pytest.fixture
def data_dir(release_0_1_0_dir: Path, tmp_path: Path) -> Path:
    """A copy of the 0.1.0 data dir, this test's to change."""
    return Path(shutil.copytree(release_0_1_0_dir, tmp_path / "data", symlinks=True))


@pytest.fixture
def node(data_dir: Path) -> Iterator[BrokerProcess]:
    """A node of this tree on the data dir (not started); killed at teardown."""
    process = BrokerProcess(data_dir, SETTINGS)
    yield process
    process.kill()


def _everything_kept(node: BrokerProcess, clients: list[PahoClient],
                     stored: list[bytes] = SENT) -> None:
    """The durable session is there with the messages `stored` for it, and the retained
    message."""
    resumed = PahoClient(node.tcp, SESSION)
    clients.append(resumed)
    assert resumed.connect(clean_start=False, session_expiry=3600).session_present
    if stored:
        assert sorted(m.payload for m in resumed.wait_messages(len(stored), timeout=20)
                      ) == stored
    resumed.close()
    reader = PahoClient(node.tcp, "formats-reader")
    clients.append(reader)
    reader.connect()
    reader.subscribe(RETAINED, qos=1)
    assert [m.payload for m in reader.wait_messages(1)] == [b"kept"]


def _stamps(data_dir: Path) -> tuple[object, object]:
    """The stamps' formats (the data dir's also records the cluster's version once risen)."""
    data = json.loads((data_dir / STAMP).read_text())
    data.pop("cluster", None)
    return data, json.loads((data_dir / "raft" / "wal" / STAMP).read_text())


def _recorded_cluster_version(data_dir: Path) -> object:
    return json.loads((data_dir / STAMP).read_text()).get("cluster", {}).get("version")


def test_a_data_dir_of_release_0_1_0_opens_with_everything_and_is_stamped(
        data_dir: Path, node: BrokerProcess, clients: list[PahoClient]) -> None:
    node.start()
    assert "formats upgraded to release" in node.log_text()
    assert _stamps(data_dir) == (stamp_of(DATA_DIR), stamp_of(WAL_DIR))
    # Its only member runs this tree: the cluster's version rises, and is recorded.
    wait_until(lambda: _recorded_cluster_version(data_dir) == versions.HIGHEST, 10,
               "the cluster version in the data dir's stamp")
    _everything_kept(node, clients)
    assert node.stop() == 0
    node.log_lines.clear()
    node.start()  # stamped: nothing more to do
    assert "formats upgraded" not in node.log_text()
    _everything_kept(node, clients, [])  # (the messages were acknowledged)


def test_a_kill_between_the_two_stamps_restarts_cleanly(
        data_dir: Path, node: BrokerProcess, clients: list[PahoClient]) -> None:
    """The node is killed -9 after stamping the data dir, while it waits to write the
    write-ahead log's stamp (its temporary file is a FIFO nobody reads, which holds the
    open); the crash leaves that temporary file half written."""
    wal_tmp = data_dir / "raft" / "wal" / (STAMP + ".tmp")
    os.mkfifo(wal_tmp)
    process = subprocess.Popen(node.command(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, **node.popen_options())
    try:
        wait_until(lambda: (data_dir / STAMP).exists() or process.poll() is not None, 20,
                   "the data dir's stamp")
        assert process.poll() is None, "the node stopped instead of waiting on the FIFO"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert json.loads((data_dir / STAMP).read_text()) == stamp_of(DATA_DIR)
    assert not (data_dir / "raft" / "wal" / STAMP).exists()
    wal_tmp.unlink()
    wal_tmp.write_bytes(b'{"kind": "mqtt-br')
    node.start()
    assert _stamps(data_dir) == (stamp_of(DATA_DIR), stamp_of(WAL_DIR))
    assert not wal_tmp.exists()
    _everything_kept(node, clients)


def _refused(node: BrokerProcess) -> str:
    """Starts the node, which must refuse the data dir: its stderr."""
    done = subprocess.run(node.command(), capture_output=True, text=True, timeout=60,
                          **node.popen_options())
    assert done.returncode == 2, done.stderr
    return done.stderr


def _refused_twice_untouched(data_dir: Path, node: BrokerProcess) -> str:
    """A refusal changes nothing, and starting again (a restarting pod) neither."""
    before = state(data_dir)
    message = _refused(node)
    assert state(data_dir) == before
    assert _refused(node) == message
    assert state(data_dir) == before
    assert "broker: cannot start: " in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("newer", ["format", "cluster-version"])
def test_a_data_dir_of_a_newer_release_is_refused_and_left_untouched(
        data_dir: Path, node: BrokerProcess, newer: str) -> None:
    """A newer format, or a cluster that rose to a version this code does not run (a
    downgrade: it would skip the log entries of that version's kinds)."""
    doc = stamp_of(DATA_DIR)
    if newer == "format":
        doc["formats"]["sessions"] = {"version": 2, "read_by": "0.3.0"}
        what, version = "format sessions", 2
    else:
        version = versions.HIGHEST + 1
        doc["cluster"] = {"version": version, "run_by": "0.3.0"}
        what = "this node's cluster runs cluster version"
    (data_dir / STAMP).write_text(json.dumps(doc))
    message = _refused_twice_untouched(data_dir, node)
    assert str(data_dir / STAMP) in message and what in message
    assert f"version {version}" in message and "release 0.3.0" in message
    assert f"this is release {RELEASE}" in message


def _truncate_first_segment(data_dir: Path) -> Path:
    """The first of two segments cut inside its header (the second a valid empty one)."""
    wal_dir = data_dir / "raft" / "wal"
    first = sorted(wal_dir.glob("*.wal"))[0]
    (wal_dir / f"{int(first.stem, 16) + 1:016x}.wal").write_bytes(b"RAFTWAL1")
    with first.open("r+b") as file:
        file.truncate(5)
    return first


@pytest.mark.parametrize("damage", ["garbage-stamp", "foreign-json-stamp",
                                    "truncated-segment-header", "binary-site-id",
                                    "foreign-metadata-json", "truncated-slab-manifest"])
def test_a_damaged_or_foreign_file_is_refused_naming_it(
        data_dir: Path, node: BrokerProcess, damage: str) -> None:
    if damage == "garbage-stamp":
        bad = data_dir / STAMP
        bad.write_bytes(b"\x89PNG\r\n\x1a\n")
        reason = "not a format stamp of this broker (not JSON"
    elif damage == "foreign-json-stamp":
        bad = data_dir / "raft" / "wal" / STAMP
        bad.write_text('{"name": "someone else\'s", "version": 3}')
        reason = "not a format stamp of this broker (no \"kind\""
    elif damage == "truncated-segment-header":
        bad = _truncate_first_segment(data_dir)
        reason = "not a write-ahead log segment: it is 5 bytes"
    elif damage == "binary-site-id":
        bad = data_dir / "ds" / "site_id"
        bad.write_bytes(b"\xfe\xed\xfa\xce")
        reason = "not the file of format site this broker writes ('utf-8' codec"
    elif damage == "foreign-metadata-json":
        bad = data_dir / "raft" / "metadata.json"
        bad.write_text('["not", "ours"]')
        reason = "not the file of format raft-metadata this broker writes (not a JSON object"
    else:  # the sealed generation's: read when its shard opens, after other stores
        bad = sorted(data_dir.glob("ds/messages/shard-*/gen-*/manifest.json"))[0]
        bad.write_bytes(bad.read_bytes()[:-40])
        reason = "not the file of format messages this broker writes (Expecting"
    message = _refused_twice_untouched(data_dir, node)
    assert f"{bad}: {reason}" in message
