"""The Spark jobs on local[2] over real slabs: exact counts, an exact Parquet round trip,
filters, and damaged or unsealed slabs. Slabs of `live` are read while the broker that owns
them runs."""

import hashlib
import os
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

import export
import slabframe
import slabs
import stats
from broker.ds import TTV
from tests.spark.rows import collect, ordered
from tests.support.slabdata import (
    N_SHARDS,
    TOPICS,
    sample_messages,
    write_generations,
)

ROOT = Path(__file__).resolve().parents[2]
UNSEALED = "unsealed (no manifest.json yet)"
_HOUR_US = 3_600_000_000


def fingerprint(data_dir: Path) -> dict[str, str]:
    """Contents of every sealed slab's files (LevelDB's own LOG aside, which the broker
    may append to at any time)."""
    return {
        str(path.relative_to(data_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
        for manifest in data_dir.glob("ds/messages/shard-*/gen-*/manifest.json")
        for path in manifest.parent.iterdir() if not path.name.startswith("LOG")
    }


def iso(us: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)).isoformat()


def test_export_round_trip_while_the_broker_runs(spark: SparkSession, live, tmp_path) -> None:
    assert live.sealed_by_broker == N_SHARDS  # generation 2 got data on every shard
    before = fingerprint(live.data_dir)
    out = tmp_path / "lake"

    summary = export.main([str(live.data_dir), "--output", str(out)])

    assert summary["slabs_read"] == 2 * N_SHARDS
    assert [(s["shard"], s["generation"], s["reason"]) for s in summary["skipped"]] == [
        (shard, 3, UNSEALED) for shard in range(N_SHARDS)]  # the broker's new current ones
    back = spark.read.parquet(str(out))
    assert collect(back) == ordered(live.expected)
    assert len(live.expected) == 200
    dates = {iso(r["timestamp_us"])[:10] for r in live.expected}
    assert {str(p.relative_to(out)) for p in out.glob("date=*/shard=*/generation=*")} == {
        f"date={d}/shard={s}/generation={g}" for d in dates for s in range(N_SHARDS)
        for g in (1, 2)}
    # The broker's files are untouched and it still serves.
    assert fingerprint(live.data_dir) == before
    assert live.broker.proc.poll() is None

    export.main([str(live.data_dir), "--output", str(out), "--generation", "2"])
    assert spark.read.parquet(str(out)).count() == 200  # replaced, not appended


def _stats(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    groups: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["timestamp_us"] // _HOUR_US * _HOUR_US, row[key]].append(row)
    return sorted(({
        "hour": hour, key: value, "messages": len(group),
        "bytes": sum(len(r["payload"]) for r in group),
        "publishers": len({r["publisher"] for r in group}),
        **{f"qos{q}": sum(1 for r in group if r["qos"] == q) for q in range(3)},
    } for (hour, value), group in groups.items()), key=lambda r: (r["hour"], r[key]))


def test_stats_per_topic_and_stream_are_exact(spark: SparkSession, live, tmp_path) -> None:
    out = tmp_path / "stats"
    summary = stats.main([str(live.data_dir), "--output", str(out)])
    assert summary["rows"] == {"by_topic": len(_stats(live.expected, "topic")),
                               "by_stream": len(_stats(live.expected, "structure"))}
    assert "fleet/+/gps" in {r["structure"] for r in live.expected}  # LTS grouped devices
    for table, key in (("by_topic", "topic"), ("by_stream", "structure")):
        frame = spark.read.parquet(str(out / table))
        got = [{**row.asDict(), "hour": row["hour_us"]} for row in frame.selectExpr(
            "unix_micros(hour) AS hour_us", key, "messages", "bytes", "publishers", "qos0",
            "qos1", "qos2").orderBy("hour_us", key).collect()]
        for row in got:
            del row["hour_us"]
        assert got == _stats(live.expected, key)


@pytest.mark.parametrize(("topic_filter", "topics"), [
    ("plant/+/temp", {"plant/1/temp", "plant/2/temp", "plant/3/temp"}),
    ("fleet/truck12/gps", {"fleet/truck12/gps"}),  # learned into the `fleet/+/gps` stream
    ("fleet/#", {t for t in TOPICS if t.startswith("fleet/")}),
    ("#", {t for t in TOPICS if not t.startswith("$")}),
    ("+/broker/load", set()),  # a leading wildcard never matches a `$` topic
    ("$SYS/#", {"$SYS/broker/load"}),
])
def test_topic_filter(spark: SparkSession, live, topic_filter: str, topics: set[str]) -> None:
    frame, _ = slabframe.read_messages(
        spark, live.data_dir, slabs.Selection(topic_filter=topic_filter))
    assert collect(frame) == ordered(r for r in live.expected if r["topic"] in topics)


def test_time_range_with_a_filter(spark: SparkSession, live) -> None:
    times = sorted(r["timestamp_us"] for r in live.expected)
    since, until = times[30], times[150]
    frame, _ = slabframe.read_messages(spark, live.data_dir, slabs.Selection(
        "plant/#", slabs.parse_time(iso(since)), slabs.parse_time(iso(until))))
    expected = [r for r in live.expected
                if since <= r["timestamp_us"] < until and r["topic"].startswith("plant/")]
    assert len(expected) > 10
    assert collect(frame) == ordered(expected)


def test_spark_submit_while_the_broker_runs(live, tmp_path) -> None:
    out = tmp_path / "stats"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
         str(ROOT / "spark-apps" / "stats.py"), str(live.data_dir), "--output", str(out),
         "--format", "csv", "--topic-filter", "alerts/fire"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for f in sorted((out / "by_topic").glob("*.csv"))
             for line in f.read_text().splitlines()]
    expected = _stats([r for r in live.expected if r["topic"] == "alerts/fire"], "topic")
    assert lines[0] == "hour,topic,messages,bytes,publishers,qos0,qos1,qos2"
    assert [line.split(",", 1)[1] for line in lines[1:]] == [
        ",".join(str(r[k]) for k in ("topic", "messages", "bytes", "publishers", "qos0",
                                     "qos1", "qos2")) for r in expected]


@pytest.fixture(scope="module")
def bulk(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Two streams of one slab, each several Arrow batches long (slabs._BATCH rows each)
    and not a whole number of them; every payload is unique."""
    data_dir = tmp_path_factory.mktemp("spark-bulk") / "data"
    messages = [TTV(f"bulk/{i % 2}", i.to_bytes(4, "big"), i % 3, False, "one-publisher")
                for i in range(2 * 2 * slabs._BATCH + 1001)]
    return data_dir, write_generations(data_dir, [messages], [True])


def test_batches_neither_drop_nor_repeat_rows(spark: SparkSession, bulk, tmp_path) -> None:
    data_dir, expected = bulk
    assert len({r["stream"] for r in expected}) == 2
    frame, _ = slabframe.read_messages(spark, data_dir, slabs.Selection())
    assert collect(frame) == ordered(expected)

    times = sorted(r["timestamp_us"] for r in expected)  # a range ending inside a batch
    since, until = times[slabs._BATCH // 2], times[3 * slabs._BATCH + 17]
    frame, _ = slabframe.read_messages(spark, data_dir, slabs.Selection(
        since=since, until=until))
    assert collect(frame) == ordered(r for r in expected if since <= r["timestamp_us"] < until)

    summary = stats.main([str(data_dir), "--output", str(tmp_path / "stats")])
    assert summary["rows"] == {"by_topic": len(_stats(expected, "topic")),
                               "by_stream": len(_stats(expected, "structure"))}
    by_topic = spark.read.parquet(str(tmp_path / "stats" / "by_topic"))
    assert by_topic.selectExpr("sum(messages)").first()[0] == len(expected)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Generation 1 sealed on every shard, then damaged on shard 0 (table bytes) and
    shard 1 (manifest); generation 2 holds data but is not sealed."""
    data_dir = tmp_path_factory.mktemp("spark-damaged") / "data"
    expected = write_generations(
        data_dir, [sample_messages(0, 100), sample_messages(100, 40)], [True, False])
    shards = data_dir / "ds" / "messages"
    table = max((shards / "shard-000" / "gen-000001").glob("*.ldb"),
                key=lambda p: p.stat().st_size)
    raw = bytearray(table.read_bytes())
    raw[20:60] = bytes(40)
    table.write_bytes(bytes(raw))
    (shards / "shard-001" / "gen-000001" / "manifest.json").write_text("{not json")
    return data_dir, expected


def test_damaged_and_unsealed_slabs_are_skipped_and_reported(spark: SparkSession,
                                                             damaged) -> None:
    data_dir, expected = damaged
    frame, report = slabframe.read_messages(spark, data_dir, slabs.Selection())
    assert collect(frame) == ordered(
        r for r in expected if r["generation"] == 1 and r["shard"] in (2, 3))
    summary = report.to_json()
    assert summary["slabs_read"] == 2
    reasons = {(s["shard"], s["generation"]): s["reason"] for s in summary["skipped"]}
    assert reasons.pop((0, 1)).startswith("corrupt: ")
    assert reasons.pop((1, 1)).startswith("corrupt: manifest.json unreadable")
    assert reasons == {(shard, 2): UNSEALED for shard in range(N_SHARDS)}

    with pytest.raises(slabs.ReaderError, match="shard-001/gen-000001: corrupt: manifest"):
        slabframe.read_messages(spark, data_dir, slabs.Selection(), strict=True)


def run_job(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYSPARK_PYTHON": sys.executable})


@pytest.mark.parametrize("job", ["export", "stats"])  # a JVM of its own, lean for stats
def test_strict_fails_the_job_with_one_line(damaged, tmp_path, job: str) -> None:
    data_dir, _ = damaged
    result = run_job(str(ROOT / "spark-apps" / f"{job}.py"), str(data_dir), "--master",
                     "local[2]", "--strict", "--shard", "0", "--output", str(tmp_path / "x"))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{job}: failed: {data_dir}/ds/messages/shard-000/gen-000001: "
                           "corrupt: "), result.stderr[-3000:]


@pytest.mark.parametrize(("args", "message"), [
    (["/nonexistent/data"], "stats: error: no such path: /nonexistent/data"),
    (["{tmp}"], "stats: error: no Durable Storage messages database in {tmp} (no db.json)"),
    (["{tmp}", "--topic-filter", "a/#/b"], "stats: error: invalid topic filter 'a/#/b'"),
    (["{tmp}", "--since", "yesterday"], "stats: error: not an ISO 8601 time: 'yesterday'"),
])
def test_bad_input_is_one_line_without_starting_spark(tmp_path, args, message) -> None:
    args = [a.format(tmp=tmp_path) for a in args]
    result = run_job(str(ROOT / "spark-apps" / "stats.py"), *args, "--master", "local[2]")
    assert result.returncode == 2
    assert result.stderr == message.format(tmp=tmp_path) + "\n"
