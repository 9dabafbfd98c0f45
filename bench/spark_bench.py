"""Spark stats job vs a single-process plyvel scan over the same sealed slabs.

Writes N messages (default 1M, 4 shards, 1,000 topics under `sensors/+/temp`, 64-byte
payloads) with the DS library and seals them, then measures:
  - plyvel: one process opens each slab and decodes every value (broker.ds.ttv), the floor
    any reader pays;
  - start-up overhead: starting the JVM and a local[2] session, plus the stats job over a
    one-message database (planning, stages, tasks: what every run pays whatever the data);
  - per-job cost: the same one-message job again, in the warm session;
  - stats: the stats job (`stats.main`, output to Parquet) over the N messages, in the same
    session.
Each timing but the start-up is the median of --repeat runs (the machine is shared; the
1-minute load averages before and after are reported beside them).
messages/s of the job = N / stats (in a warm session, its fixed per-job cost included, so
noise cannot make it look better than it is); the ratio is that over plyvel's. The marginal
rate leaves the per-job cost out: N / (stats - per-job cost).
Results go to bench/spark_results.json.

With --stream, the streaming mode of the jobs against their batch mode over the same four
sealed slabs instead: `stats.py` and `export.py` with and without `--stream --checkpoint`
(each streaming run with a fresh checkpoint and output, so it reads every generation, in
one Trigger.AvailableNow micro-batch), alternately, in one warm local[2] session per job
(in a process of its own, with the JVM the job's main starts: lean for stats); the
ratio is the streaming run's messages/s over the batch run's (median of --repeat each),
and the marginal ratio leaves out each mode's fixed cost per run (its run over one message).
The CPU seconds of each run over the N (the session's JVM, its Python workers and the
processes a streaming query starts) are reported too, with their ratio (batch over
streaming: messages per CPU second, per core, of the streaming run over the batch run's),
since the machine is shared and CPU time moves less with other load than wall time.
Results go to bench/spark_stream_results.json.
"""

import argparse
import asyncio
import ctypes
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import plyvel
from pyspark.sql import SparkSession

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procstat
from broker.ds import TTV, DurableStorage, Settings, keys
from broker.ds.manifest import read_manifest
from broker.ds.storage import MESSAGES
from broker.ds.ttv import decode_value

# spark-apps/ is not a package: its jobs run as scripts and import each other by name.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark-apps"))
import export
import slabframe
import stats

ROOT = Path(__file__).resolve().parents[1]
_BATCH = 10_000
_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def write(data_dir: Path, count: int) -> None:
    async def run() -> None:
        storage = DurableStorage(data_dir, Settings(n_shards=4, generation_max_size=1 << 40))
        payload = bytes(64)
        for start in range(0, count, _BATCH):
            await storage.store_batch(MESSAGES, [
                TTV(f"sensors/{i % 1000}/temp", payload, i % 3, False, f"device-{i % 5000}")
                for i in range(start, min(start + _BATCH, count))
            ], sync=False)
        await storage.seal()
        await storage.close()

    asyncio.run(run())


def plyvel_scan(data_dir: Path) -> int:
    decoded = 0
    for manifest in sorted(data_dir.glob("ds/messages/shard-*/gen-*/manifest.json")):
        db = plyvel.DB(str(manifest.parent))
        for stream in read_manifest(manifest.parent)["streams"]:
            for value in db.iterator(prefix=keys.master_prefix(stream["id"]),
                                     include_key=False):
                decode_value(value)
                decoded += 1
        db.close()
    return decoded


def timed(job: Callable[[], object]) -> float:
    started = time.perf_counter()
    job()
    return time.perf_counter() - started


def adopt_orphans() -> None:
    """Makes this process the subreaper of its descendants: one whose parent exits stays
    in this process's tree instead of going to init, so tree_cpu_seconds still counts it
    (the mqtt-ds source's spare runner outlives the runner it was forked from)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def timed_cpu(job: Callable[[], object]) -> tuple[float, float]:
    """Seconds and CPU seconds of this process's tree (the JVM, its Python workers, the
    processes a query starts): the CPU moves less with other load than the seconds do."""
    cpu = procstat.tree_cpu_seconds(os.getpid())
    seconds = timed(job)
    return seconds, procstat.tree_cpu_seconds(os.getpid()) - cpu


def median_of(repeat: int, job: Callable[[], object]) -> float:
    return statistics.median(timed(job) for _ in range(repeat))


def stream_vs_batch(work: Path, big: Path, tiny: Path, messages: int,
                    repeat: int) -> dict[str, Any]:
    """Each job's streaming mode against its batch mode over the same slabs, alternately,
    in a process of its own: a local session's JVM options are fixed when it starts, and
    each job is measured in the JVM its main starts for itself (stats: slabframe's lean
    JVM, stats.LEAN_JVM; export: the default one)."""
    results: dict[str, Any] = {"messages": messages, "cores": os.cpu_count(),
                               "repeat": repeat, "load_before": round(os.getloadavg()[0], 2)}
    spawn = multiprocessing.get_context("spawn")
    for name in ("stats", "export"):
        with ProcessPoolExecutor(1, mp_context=spawn) as process:
            results[name] = process.submit(
                _job_stream_vs_batch, name, work, big, tiny, messages, repeat).result()
    results["load_after"] = round(os.getloadavg()[0], 2)
    return results


def _job_stream_vs_batch(name: str, work: Path, big: Path, tiny: Path, messages: int,
                         repeat: int) -> dict[str, Any]:
    adopt_orphans()
    job: Any = {"stats": stats, "export": export}[name]
    slabframe.session("bench", "local[2]", lean_jvm=getattr(job, "LEAN_JVM", False))
    runs = iter(range(1_000_000))

    def batch(data: Path) -> None:
        job.main([str(data), "--output", str(work / f"{name}-out-{next(runs)}")])

    def stream(data: Path) -> None:
        run = next(runs)
        job.main([str(data), "--stream", "--checkpoint", str(work / f"{name}-ck-{run}"),
                  "--output", str(work / f"{name}-out-{run}")])

    batch(tiny)  # the first job of each kind pays for class loading and JIT
    stream(tiny)
    times: dict[str, list[float]] = {"batch": [], "stream": [], "batch_tiny": [],
                                     "stream_tiny": []}
    cpu: dict[str, list[float]] = {"batch": [], "stream": []}
    for _ in range(repeat):
        for mode, run in (("batch", batch), ("stream", stream)):
            seconds, cpu_s = timed_cpu(lambda run=run: run(big))
            times[mode].append(seconds)
            cpu[mode].append(cpu_s)
            times[f"{mode}_tiny"].append(timed(lambda run=run: run(tiny)))
    m = {mode: statistics.median(values) for mode, values in times.items()}
    c = {mode: statistics.median(values) for mode, values in cpu.items()}
    per = {mode: messages / max(m[mode] - m[f"{mode}_tiny"], 1e-3)
           for mode in ("batch", "stream")}
    return {
        "batch_s": round(m["batch"], 2), "stream_s": round(m["stream"], 2),
        "batch_per_run_s": round(m["batch_tiny"], 2),
        "stream_per_run_s": round(m["stream_tiny"], 2),
        "batch_msgs_per_s": round(messages / m["batch"]),
        "stream_msgs_per_s": round(messages / m["stream"]),
        "stream_to_batch": round(m["batch"] / m["stream"], 2),
        "batch_cpu_s": round(c["batch"], 2), "stream_cpu_s": round(c["stream"], 2),
        "cpu_stream_to_batch": round(c["batch"] / c["stream"], 2),
        "marginal_stream_to_batch": round(per["stream"] / per["batch"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stream", action="store_true",
                        help="the jobs' streaming mode against their batch mode")
    parser.add_argument("--output", type=Path, help="results JSON path (default: "
                        "bench/spark_results.json, with --stream spark_stream_results.json)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    try:
        big, tiny = work / "big", work / "tiny"
        started = time.perf_counter()
        write(big, args.messages)
        write(tiny, 1)
        print(f"wrote {args.messages} messages in {time.perf_counter() - started:.1f} s")
        if args.stream:
            streamed = stream_vs_batch(work, big, tiny, args.messages, args.repeat)
            print(json.dumps(streamed, indent=1))
            (args.output or ROOT / "bench" / "spark_stream_results.json").write_text(
                json.dumps(streamed, indent=1) + "\n")
            return

        load_before = os.getloadavg()[0]
        assert plyvel_scan(big) == args.messages
        plyvel_s = median_of(args.repeat, lambda: plyvel_scan(big))
        # the session stats.main would start for itself (it finds this one active)
        spark_s = timed(lambda: slabframe.session("bench", "local[2]", lean_jvm=True))
        options = SparkSession.getActiveSession().sparkContext.getConf().get(
            "spark.driver.extraJavaOptions", "")
        tiny_job = [str(tiny), "--output", str(work / "out-tiny")]
        tiny_s = timed(lambda: stats.main(tiny_job))
        job_s = median_of(args.repeat, lambda: stats.main(tiny_job))
        stats_s = median_of(args.repeat, lambda: stats.main(
            [str(big), "--output", str(work / "out-big")]))
        results = {
            "messages": args.messages, "cores": os.cpu_count(), "repeat": args.repeat,
            "plyvel_scan_s": round(plyvel_s, 2),
            "plyvel_msgs_per_s": round(args.messages / plyvel_s),
            "class_archive": "mapped" if "SharedArchiveFile" in options else (
                "written at exit" if "ArchiveClassesAtExit" in options else "none"),
            "session_start_s": round(spark_s, 1), "tiny_job_s": round(tiny_s, 1),
            "startup_overhead_s": round(spark_s + tiny_s, 1),
            "per_job_s": round(job_s, 2), "stats_s": round(stats_s, 2),
            "stats_msgs_per_s": round(args.messages / stats_s),
            "marginal_msgs_per_s": round(args.messages / max(stats_s - job_s, 1e-3)),
            # the machine is shared: what else ran, as 1-minute load averages
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
        }
        results["ratio_to_plyvel"] = round(
            results["stats_msgs_per_s"] / results["plyvel_msgs_per_s"], 2)
        results["marginal_ratio_to_plyvel"] = round(
            results["marginal_msgs_per_s"] / results["plyvel_msgs_per_s"], 2)
        print(json.dumps(results, indent=1))
        (args.output or ROOT / "bench" / "spark_results.json").write_text(
            json.dumps(results, indent=1) + "\n")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
