"""The executor-side reader without Spark: planning from manifests, private copies,
verification and row mapping, on slabs written by the DS library."""

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import slabs
from broker.ds.manifest import read_manifest
from broker.ds.slab import SPARE_FILE
from tests.support.slabdata import N_SHARDS, sample_messages, write_generations

UNSEALED = "unsealed (no manifest.json yet)"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    data_dir = tmp_path_factory.mktemp("slabs") / "data"
    return data_dir, write_generations(
        data_dir, [sample_messages(0, 200), sample_messages(200, 20)], [True, False])


def read_all(tasks: list[slabs.SlabTask], selection: slabs.Selection) -> list[dict]:
    problems: list[slabs.Skipped] = []
    rows = [row for batch in slabs.read_tasks(tasks, selection, False, problems.append)
            for row in batch.to_pylist()]
    assert problems == []
    return rows


def test_plan_reads_sealed_slabs_and_reports_unsealed_ones(written) -> None:
    data_dir, expected = written
    for path in (data_dir, data_dir / "ds", data_dir / "ds" / "messages"):
        tasks, skipped = slabs.plan(path, slabs.Selection())
        assert [(t.shard, t.generation) for t in tasks] == [(s, 1) for s in range(N_SHARDS)]
        assert [(s.shard, s.generation, s.reason) for s in skipped] == [
            (s, 2, UNSEALED) for s in range(N_SHARDS)]
    assert sum(t.messages for t in tasks) == sum(
        1 for r in expected if r["generation"] == 1)


def test_plan_passes_over_a_raft_snapshot_beside_the_shards(written, tmp_path) -> None:
    """A replicated node spools and installs snapshots next to the shard they are of."""
    data_dir = tmp_path / "data"
    shutil.copytree(written[0], data_dir)
    messages = data_dir / "ds" / "messages"
    (messages / "shard-000.snapshot-out").write_bytes(b"\x01")
    (messages / "shard-001.snapshot").mkdir()
    tasks, _ = slabs.plan(data_dir, slabs.Selection())
    assert [(t.shard, t.generation) for t in tasks] == [(s, 1) for s in range(N_SHARDS)]


def test_plan_passes_over_a_generation_made_ahead(written, tmp_path) -> None:
    """A node makes each shard's next generation ahead (broker/ds/spare.py): not data, nor
    an unsealed generation, until a rotation takes it."""
    data_dir = tmp_path / "data"
    shutil.copytree(written[0], data_dir)
    spare = data_dir / "ds" / "messages" / "shard-000" / "gen-000003"
    spare.mkdir()
    (spare / SPARE_FILE).write_bytes(b"")
    tasks, skipped = slabs.plan(data_dir, slabs.Selection())
    assert [(t.shard, t.generation) for t in tasks] == [(s, 1) for s in range(N_SHARDS)]
    assert [(s.shard, s.generation) for s in skipped] == [(s, 2) for s in range(N_SHARDS)]


def test_plan_prunes_by_shard_generation_time_and_structure(written) -> None:
    data_dir, _ = written
    tasks, _ = slabs.plan(data_dir, slabs.Selection(shard=2))
    assert [(t.shard, t.generation) for t in tasks] == [(2, 1)]
    assert slabs.plan(data_dir, slabs.Selection(generation=2))[0] == []
    every = slabs.plan(data_dir, slabs.Selection())[0]
    newest = max(read_manifest(Path(t.path))["max_timestamp"] for t in every)
    assert slabs.plan(data_dir, slabs.Selection(since=newest))[0]
    assert slabs.plan(data_dir, slabs.Selection(since=newest + 1))[0] == []
    tasks, _ = slabs.plan(data_dir, slabs.Selection(topic_filter="alerts/fire"))
    assert {structure for t in tasks for _, structure in t.streams} == {"alerts/fire"}
    assert slabs.plan(data_dir, slabs.Selection(topic_filter="nothing/+"))[0] == []


# One pass that reads, checks and holds a slab, or one that checks before one that reads
# (held bytes 0: the batches outgrow what a worker holds).
HELD = pytest.mark.parametrize("held", [slabs._HELD_BYTES, 0], ids=["one pass", "two"])


@HELD
@pytest.mark.parametrize("batch", [7, 8192])  # a stream spans several batches, or one
def test_rows_map_every_column(written, monkeypatch, batch: int, held: int) -> None:
    monkeypatch.setattr(slabs, "_BATCH", batch)
    monkeypatch.setattr(slabs, "_HELD_BYTES", held)
    data_dir, expected = written
    tasks, _ = slabs.plan(data_dir, slabs.Selection())
    got = sorted(read_all(tasks, slabs.Selection()),
                 key=lambda r: (r["shard"], r["timestamp_us"]))
    for row in got:
        row["user_properties"] = [(kv["key"], kv["value"]) for kv in row["user_properties"]]
    want = sorted((r for r in expected if r["generation"] == 1),
                  key=lambda r: (r["shard"], r["timestamp_us"]))
    assert got == want
    assert any(r["user_properties"] for r in want) and any(r["correlation_data"] for r in want)


@pytest.mark.parametrize("batch", [4, 8192])  # the range ends inside a batch, or not
def test_rows_of_a_time_range_and_filter(written, monkeypatch, batch: int) -> None:
    monkeypatch.setattr(slabs, "_BATCH", batch)
    data_dir, expected = written
    times = sorted(r["timestamp_us"] for r in expected if r["generation"] == 1)
    selection = slabs.Selection("plant/+/temp", times[10], times[40])
    tasks, _ = slabs.plan(data_dir, selection)
    got = sorted((row["topic"], row["timestamp_us"]) for row in read_all(tasks, selection))
    assert got == sorted(
        (r["topic"], r["timestamp_us"]) for r in expected
        if r["generation"] == 1 and times[10] <= r["timestamp_us"] < times[40]
        and r["topic"].startswith("plant/") and r["topic"].endswith("/temp"))
    assert got


@pytest.mark.parametrize("columns", [["topic", "timestamp_us"], ["timestamp_us"]])
def test_a_filter_the_structure_does_not_settle_is_matched_per_topic(
        written, columns: list[str]) -> None:
    data_dir, expected = written
    selection = slabs.Selection("fleet/truck12/gps")
    tasks, _ = slabs.plan(data_dir, selection)
    assert "fleet/+/gps" in {structure for t in tasks for _, structure in t.streams}
    schema = pa.schema([slabs.SCHEMA.field(c) for c in columns])
    got = [row for batch in slabs.read_tasks(tasks, selection, False, print, schema=schema)
           for row in batch.to_pylist()]
    want = [{c: r[c] for c in columns} for r in expected
            if r["generation"] == 1 and r["topic"] == "fleet/truck12/gps"]
    by_time = sorted(want, key=lambda r: r["timestamp_us"])
    assert sorted(got, key=lambda r: r["timestamp_us"]) == by_time != []


@HELD
def test_a_slab_that_lost_messages_is_reported_not_read(written, monkeypatch, held) -> None:
    monkeypatch.setattr(slabs, "_HELD_BYTES", held)
    data_dir, _ = written
    task = slabs.plan(data_dir, slabs.Selection(shard=0))[0][0]
    claimed = slabs.SlabTask(task.path, task.shard, task.generation, task.messages + 1,
                             task.streams)
    problems: list[slabs.Skipped] = []
    rows = list(slabs.read_tasks([claimed], slabs.Selection(), False, problems.append))
    assert rows == []
    assert [p.reason for p in problems] == [
        f"corrupt: {task.messages} messages stored, the manifest says {task.messages + 1}"]
    with pytest.raises(slabs.SlabError, match=f"^{task.path}: corrupt: "):
        list(slabs.read_tasks([claimed], slabs.Selection(), True, problems.append))


@HELD
def test_a_slab_with_damaged_table_bytes_is_reported_not_read(
        written, tmp_path, monkeypatch, held: int) -> None:
    monkeypatch.setattr(slabs, "_HELD_BYTES", held)
    data_dir, _ = written
    task = slabs.plan(data_dir, slabs.Selection(shard=2))[0][0]
    damaged = tmp_path / "gen"
    shutil.copytree(task.path, damaged)
    table = max(damaged.glob("*.ldb"), key=lambda p: p.stat().st_size)
    raw = bytearray(table.read_bytes())
    raw[len(raw) // 3:len(raw) // 3 + 40] = bytes(40)
    table.write_bytes(bytes(raw))
    problems: list[slabs.Skipped] = []
    rows = list(slabs.read_tasks(
        [slabs.SlabTask(str(damaged), *(task.shard, task.generation, task.messages,
                                        task.streams))],
        slabs.Selection(), False, problems.append))
    assert rows == []
    assert [p.reason.split(":")[0] for p in problems] == ["corrupt"], problems


def test_a_vanished_slab_is_reported(written, tmp_path) -> None:
    data_dir, _ = written
    task = slabs.plan(data_dir, slabs.Selection(shard=1))[0][0]
    gone = slabs.SlabTask(str(tmp_path / "gone"), *(task.shard, task.generation,
                                                    task.messages, task.streams))
    problems: list[slabs.Skipped] = []
    assert list(slabs.read_tasks([gone], slabs.Selection(), False, problems.append)) == []
    assert [p.reason for p in problems] == [
        "vanished: dropped by retention while being read"]


def test_snapshot_copies_again_when_the_broker_reopens_the_slab(
    written, tmp_path, monkeypatch
) -> None:
    data_dir, _ = written
    source = tmp_path / "source"
    shutil.copytree(Path(slabs.plan(data_dir, slabs.Selection())[0][0].path), source)
    (source / "LOCK").write_bytes(b"")
    copies: list[str] = []
    real_copy = shutil.copyfile

    def copy_while_reopened(src: str, dst: Path) -> None:
        copies.append(Path(src).name)
        if len(copies) == 1:  # as if the broker restarted: a new LevelDB MANIFEST
            (source / "CURRENT").write_bytes(b"MANIFEST-999999\n")
        real_copy(src, dst)

    monkeypatch.setattr(shutil, "copyfile", copy_while_reopened)
    slabs.snapshot(source, tmp_path / "copy")
    files = sorted(p.name for p in source.iterdir() if p.name != "LOCK")
    assert len(copies) == 2 * len(files)
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == files


def test_selection_errors() -> None:
    with pytest.raises(slabs.ReaderError, match="invalid topic filter"):
        slabs.check_selection(slabs.Selection("a/#/b"))
    with pytest.raises(slabs.ReaderError, match="shared subscription"):
        slabs.check_selection(slabs.Selection("$share/g/a"))
    with pytest.raises(slabs.ReaderError, match="--since must be before --until"):
        slabs.check_selection(slabs.Selection(since=5, until=5))


@pytest.mark.parametrize(("text", "us"), [
    ("1970-01-01T00:00:00", 0),
    ("2026-01-02T03:04:05.000006Z", 1_767_323_045_000_006),
    ("2026-01-02T04:04:05.000006+01:00", 1_767_323_045_000_006),
])
def test_parse_time(text: str, us: int) -> None:
    assert slabs.parse_time(text) == us


def test_batches_hold_only_the_columns_asked_for(written) -> None:
    data_dir, expected = written
    tasks, _ = slabs.plan(data_dir, slabs.Selection())
    schema = pa.schema([slabs.SCHEMA.field("structure"), slabs.SCHEMA.field("qos")])
    got = [row for batch in slabs.read_tasks(tasks, slabs.Selection(), True, print,
                                             schema=schema) for row in batch.to_pylist()]
    assert sorted((r["structure"], r["qos"]) for r in got) == sorted(
        (r["structure"], r["qos"]) for r in expected if r["generation"] == 1)
