"""The `mqtt-ds` data source on local[2]: batch reads, micro-batches of whole generations,
exactly-once into a Parquet table across a driver killed between a batch's write and its
commit, and a generation dropped by retention before it was read."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

import mqtt_ds
import slabframe
from broker.ds import DurableStorage, Settings
from streamjob import iso
from tests.spark.rows import collect, ordered
from tests.support.slabdata import N_SHARDS, sample_messages, write_generations

ROOT = Path(__file__).resolve().parents[2]
JARS = Path(pyspark.__file__).parent / "jars"
_WAIT_S = 240


def test_batch_read_equals_the_jobs_reader(spark: SparkSession, live) -> None:
    frame = spark.read.format("mqtt-ds").load(str(live.data_dir))
    assert frame.columns == slabframe.COLUMNS
    assert collect(frame) == ordered(live.expected)

    # options push down the filter and time range; a narrower schema builds fewer columns
    times = sorted(r["timestamp_us"] for r in live.expected)
    narrow = (spark.read.format("mqtt-ds").schema("topic STRING, timestamp TIMESTAMP")
              .option("topicFilter", "plant/#").option("shard", "1")
              .option("since", iso(times[20])).option("until", iso(times[170]))
              .load(str(live.data_dir)))
    got = sorted((r.topic, r.us) for r in narrow.selectExpr(
        "topic", "unix_micros(timestamp) AS us").collect())
    assert got == sorted(
        (r["topic"], r["timestamp_us"]) for r in live.expected
        if r["topic"].startswith("plant/") and r["shard"] == 1
        and times[20] <= r["timestamp_us"] < times[170])
    assert got


def test_micro_batches_of_whole_generations(spark: SparkSession, tmp_path) -> None:
    data_dir = tmp_path / "data"
    expected = write_generations(data_dir, [sample_messages(0, 60), sample_messages(60, 60),
                                            sample_messages(120, 10)], [True, True, False])
    query = (spark.readStream.format("mqtt-ds").option("maxFilesPerTrigger", "3")
             .load(str(data_dir)).writeStream.format("parquet")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start(str(tmp_path / "out")))
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    # 8 sealed slabs, 3 a batch, the oldest generations first; the unsealed one waits
    assert len(batches) == 3
    first = batches[0]["sources"][0]["endOffset"]
    assert first == '{"format": 1, "shards": {"0": [1, 1], "1": [1, 1], "2": [1, 1], "3": [1, 0]}}'
    assert collect(spark.read.parquet(str(tmp_path / "out"))) == ordered(
        r for r in expected if r["generation"] < 3)


def test_bad_options_are_one_line(spark: SparkSession, live, tmp_path) -> None:
    for options, message in (({"maxFilesPerTrigger": "0"}, "not an integer >= 1: '0'"),
                             ({"topicFilter": "a/#/b"}, "invalid topic filter 'a/#/b'")):
        with pytest.raises(Exception, match=message):
            spark.readStream.format("mqtt-ds").options(**options).load(
                str(live.data_dir)).writeStream.format("noop").start().awaitTermination()
    with pytest.raises(Exception, match="no Durable Storage messages database"):
        spark.read.format("mqtt-ds").load(str(tmp_path)).count()
    with pytest.raises(Exception, match=r"mqtt-ds cannot read column\(s\) nope: it reads topic,"):
        spark.read.format("mqtt-ds").schema("topic STRING, nope STRING").load(
            str(live.data_dir)).count()
    assert mqtt_ds.NAME == "mqtt-ds"


def test_spark_submit_streams_without_the_jobs_on_the_python_path(live, tmp_path) -> None:
    """Under spark-submit (as on Kubernetes) the JVM runs first: the Python process that
    plans the stream must still find mqtt-ds's modules."""
    assert "spark-apps" not in os.environ.get("PYTHONPATH", "")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
         str(ROOT / "spark-apps" / "stats.py"), str(live.data_dir), "--stream",
         "--checkpoint", str(tmp_path / "ck"), "--output", str(tmp_path / "stats")],
        capture_output=True, text=True, timeout=_WAIT_S,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.splitlines()[-1])
    assert (summary["stream"], summary["slabs_read"]) == (True, 2 * N_SHARDS)


# ---- exactly once across a killed driver --------------------------------------------------

@pytest.fixture(scope="module")
def pause_class(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PauseBeforeCommit.java compiled against this pyspark's jars."""
    classes = tmp_path_factory.mktemp("pause-class")
    subprocess.run(["javac", "-d", str(classes), "-cp", f"{JARS}/*",
                    str(Path(__file__).with_name("PauseBeforeCommit.java"))],
                   check=True, timeout=120)
    return classes


@dataclass
class Driver:
    """A job's driver process (its own session and process group) and where its output
    goes: files, as a pipe nobody reads while the test waits could fill up and stall it."""

    proc: subprocess.Popen[bytes]
    logs: Path

    def err(self) -> str:
        return self.logs.with_suffix(".err").read_text()[-3000:]

    def finish(self) -> str:
        self.proc.wait(timeout=_WAIT_S)
        assert self.proc.returncode == 0, self.err()
        return self.logs.with_suffix(".out").read_text()


def _export(data_dir: Path, checkpoint: Path, lake: Path, env: dict[str, str] | None = None,
            ) -> Driver:
    """The export job's streaming mode in a driver process of its own."""
    logs = lake.parent / f"run{len(list(lake.parent.glob('run*.out')))}.log"
    with open(logs.with_suffix(".out"), "wb") as out, \
            open(logs.with_suffix(".err"), "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "spark-apps" / "export.py"), str(data_dir), "--master",
             "local[2]", "--stream", "--checkpoint", str(checkpoint), "--output", str(lake)],
            stdout=out, stderr=err, start_new_session=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})})
    return Driver(proc, logs)


def _seal_more(data_dir: Path, first: int, count: int) -> list[dict[str, Any]]:
    return write_generations(data_dir, [sample_messages(first, count)], [True])


@pytest.fixture
def drivers() -> Iterator[list[Driver]]:
    """Driver processes a test started: their process groups are killed at the end."""
    started: list[Driver] = []
    yield started
    for driver in started:
        if driver.proc.poll() is None:
            os.killpg(driver.proc.pid, signal.SIGKILL)
            driver.proc.wait()


@pytest.mark.timeout(4 * _WAIT_S)  # three driver processes, each with a JVM of its own
def test_exactly_once_across_a_driver_killed_before_the_commit(
        spark: SparkSession, pause_class: Path, drivers: list[Driver], tmp_path) -> None:
    data_dir, checkpoint, lake = tmp_path / "data", tmp_path / "ck", tmp_path / "lake"
    expected = write_generations(data_dir, [sample_messages(0, 120), sample_messages(120, 60)],
                                 [True, False])
    marker = tmp_path / "paused"
    driver = _export(data_dir, checkpoint, lake, {
        "PAUSE_BEFORE_COMMIT": "0", "PAUSE_MARKER": str(marker),
        "PYSPARK_SUBMIT_ARGS": f"--driver-class-path {pause_class} --conf "
        "spark.sql.streaming.checkpointFileManagerClass=PauseBeforeCommit pyspark-shell"})
    drivers.append(driver)
    deadline = time.monotonic() + _WAIT_S
    while not marker.exists():  # a file another process writes: polled
        assert driver.proc.poll() is None, driver.err()
        assert time.monotonic() < deadline, "the query never reached its first commit"
        time.sleep(0.2)
    # The batch is written (the sink's own log has it), its commit is not.
    assert (lake / "_spark_metadata" / "0").is_file()
    assert (checkpoint / "offsets" / "0").is_file()
    assert not (checkpoint / "commits" / "0").exists()
    os.killpg(driver.proc.pid, signal.SIGKILL)
    driver.proc.wait()
    sealed_first = [r for r in expected if r["generation"] == 1]
    assert collect(spark.read.parquet(str(lake))) == ordered(sealed_first)

    # The restart replays batch 0 (the sink keeps its files once) and commits it.
    _export(data_dir, checkpoint, lake).finish()
    assert (checkpoint / "commits" / "0").is_file()
    table = collect(spark.read.parquet(str(lake)))
    assert table == ordered(sealed_first)

    # Generations sealed since are read by the next run, and only they.
    everything = _seal_more(data_dir, 180, 40)
    out = _export(data_dir, checkpoint, lake).finish()
    assert '"slabs_read": 4' in out.splitlines()[-1]
    table = collect(spark.read.parquet(str(lake)))
    assert Counter(r["payload"] for r in table).most_common(1)[0][1] == 1
    assert table == ordered(everything)
    assert {r["generation"] for r in table} == {1, 2}
    assert len(table) == 220


# ---- retention ----------------------------------------------------------------------------

def _retention_drops_sealed(data_dir: Path) -> None:
    """The broker's own retention (DurableStorage.apply_retention) at a time when every
    sealed generation is too old."""
    async def run() -> None:
        storage = DurableStorage(data_dir, Settings(n_shards=N_SHARDS))
        try:
            await storage.apply_retention(now=int(time.time() * 1e6) + 10 * 86_400_000_000)
        finally:
            await storage.close()
    asyncio.run(run())


def test_a_generation_dropped_before_it_was_read_fails_the_query(
        spark: SparkSession, tmp_path) -> None:
    data_dir = tmp_path / "data"
    write_generations(data_dir, [sample_messages(0, 40)], [True])

    def run() -> None:
        query = (spark.readStream.format("mqtt-ds").load(str(data_dir)).writeStream
                 .format("parquet").option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start(str(tmp_path / "out")))
        query.awaitTermination()

    run()  # generation 1 read
    _seal_more(data_dir, 40, 40)  # generation 2 sealed ...
    _retention_drops_sealed(data_dir)  # ... and dropped unread
    assert not list(data_dir.glob("ds/messages/shard-*/gen-000002"))
    _seal_more(data_dir, 80, 40)  # generation 3
    with pytest.raises(StreamingQueryException,
                       match=r"shard \d generation 2 dropped \(by retention\) before this query "
                             "read it"):
        run()
