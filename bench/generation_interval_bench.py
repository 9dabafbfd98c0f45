"""What a 1-minute `durable_storage.messages.generation_interval` costs against the default
1 hour, for the same hour of messages: near-real-time analytics (the operator's `1m`
schedule reads each minute what was sealed in it) against the broker's storage and the
batch jobs.

One hour of traffic (--messages, default 360,000: 100/s; 4 shards, 1,000 topics under
`sensors/+/temp`, 64-byte payloads, as bench/spark_bench.py) is written to Durable Storage
with the DS library in 60 equal minutes, and sealed after every minute (`1m`: what the
node's generation timer does) or once after the hour (`1h`). Measured for each:
  - seals per hour (generations sealed, all shards), files and bytes of ds/messages after it;
  - the hour's stores and seals: wall time, each seal's time (median, max), and the event
    loop's longest stall while the stores and seals ran (a task that wakes every 1 ms), and
    while the seals alone ran (the stores are the benchmark's batches of 2,000 messages,
    cooked on the loop: a broker's come from its connections);
  - a replicated seal (`builtin_raft`): the time each shard's ROTATE holds the loop when
    applied (Shard.apply_rotate, after a minute of the same traffic, --rotations times);
  - the stats job (batch, warm local[2] session) over the whole hour: messages/s;
  - one tick of the streaming stats job (`--stream`, what an interval SparkApplication
    runs): with `1m`, the 60th minute's run after a checkpoint that read the first 59
    (median of --repeat: the checkpoint is copied back each time); with `1h`, the run over
    the hour, the only one it has.
Results go to bench/generation_interval_results.json. The machine is shared: the 1-minute
load averages before and after are reported beside them.
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

from broker.ds import TTV, DurableStorage, Settings
from broker.ds.storage import MESSAGES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark-apps"))
import slabframe
import stats

ROOT = Path(__file__).resolve().parents[1]
MINUTES = 60
_BATCH = 2_000


async def _heartbeat(longest: list[float], stop: asyncio.Event,
                     sealing: list[bool] | None = None) -> None:
    """The event loop's longest stall: how late a 1 ms sleep wakes; [1] the longest of
    those that began while `sealing[0]`."""
    while not stop.is_set():
        started = time.perf_counter()
        in_seal = sealing is not None and sealing[0]
        await asyncio.sleep(0.001)
        late = time.perf_counter() - started - 0.001
        longest[0] = max(longest[0], late)
        if in_seal:
            longest[1] = max(longest[1], late)


def _storage(data_dir: Path) -> DurableStorage:
    """Opened as a node opens it, each next generation made ahead (DurableStorage.start,
    without its timers)."""
    storage = DurableStorage(data_dir, Settings(n_shards=4, generation_max_size=1 << 40))
    for shard in storage.messages.created_shards:
        shard.prepare_next()
    return storage


def _minute(storage: DurableStorage, first: int, per_minute: int) -> Iterator[Awaitable[None]]:
    """A minute's stores, each made when the one before was awaited."""
    payload = bytes(64)
    for start in range(first, first + per_minute, _BATCH):
        yield storage.store_batch(MESSAGES, [
            TTV(f"sensors/{i % 1000}/temp", payload, i % 3, False, f"device-{i % 5000}")
            for i in range(start, min(start + _BATCH, first + per_minute))
        ], sync=False)


def write_hour(data_dir: Path, messages: int, seal_every_minute: bool,
               minutes: range = range(MINUTES)) -> dict[str, Any]:
    """`minutes` of the hour's traffic stored (and sealed as the interval says)."""
    per_minute = messages // MINUTES
    seals: list[float] = []
    longest = [0.0, 0.0]
    sealing = [False]

    async def run() -> float:
        storage = _storage(data_dir)
        stop = asyncio.Event()
        beat = asyncio.create_task(_heartbeat(longest, stop, sealing))
        started = time.perf_counter()
        for minute in minutes:
            for stored in _minute(storage, minute * per_minute, per_minute):
                await stored
            if seal_every_minute or minute == MINUTES - 1:
                sealing[0] = True
                began = time.perf_counter()
                await storage.seal()
                seals.append(time.perf_counter() - began)
                sealing[0] = False
        took = time.perf_counter() - started
        stop.set()
        await beat
        await storage.close()
        return took

    took = asyncio.run(run())
    return {"write_s": round(took, 2), "seals": len(seals),
            "seal_median_ms": round(statistics.median(seals) * 1000, 1) if seals else None,
            "seal_max_ms": round(max(seals) * 1000, 1) if seals else None,
            "loop_longest_stall_ms": round(longest[0] * 1000, 1),
            "loop_longest_stall_in_seals_ms": round(longest[1] * 1000, 1)}


def replicated_rotations(data_dir: Path, messages: int, rotations: int) -> dict[str, Any]:
    """How long each shard's ROTATE holds the loop where `builtin_raft` applies it (in log
    order, on the loop), each after a minute of traffic; its seal runs meanwhile."""
    per_minute = messages // MINUTES
    held: list[float] = []

    async def run() -> None:
        storage = _storage(data_dir)
        index = 0
        for minute in range(rotations):
            for stored in _minute(storage, minute * per_minute, per_minute):
                await stored
            for shard in storage.messages.created_shards:
                await asyncio.sleep(0.05)  # the spare made after the last rotation is ready
                index += 1
                began = time.perf_counter()
                shard.apply_rotate(shard.cooker.last_timestamp, index, 1)
                held.append(time.perf_counter() - began)
        for shard in storage.messages.created_shards:
            await shard.wait_sealed()
        await storage.close()

    asyncio.run(run())
    return {"rotations": len(held),
            "apply_rotate_median_ms": round(statistics.median(held) * 1000, 2),
            "apply_rotate_max_ms": round(max(held) * 1000, 2)}


def on_disk(data_dir: Path) -> dict[str, int]:
    files = [p for p in (data_dir / "ds" / "messages").rglob("*") if p.is_file()]
    return {"generations": len(list(data_dir.glob("ds/messages/shard-*/gen-*/manifest.json"))),
            "files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def timed(job: Any) -> float:
    started = time.perf_counter()
    job()
    return time.perf_counter() - started


def measure(work: Path, interval: str, messages: int, repeat: int) -> dict[str, Any]:
    every_minute = interval == "1m"
    data = work / interval / "data"
    out = work / interval / "out"
    result: dict[str, Any] = {"interval": interval}
    if every_minute:  # 59 minutes, a streaming run that reads them, then the 60th
        result |= write_hour(data, messages, True, range(MINUTES - 1))
        checkpoint, first = out / "ck", out / "ck-59"
        stats.main([str(data), "--stream", "--checkpoint", str(checkpoint),
                    "--output", str(out / "stream")])
        shutil.copytree(checkpoint, first)
        shutil.copytree(out / "stream", out / "stream-59")
        last = write_hour(data, messages, True, range(MINUTES - 1, MINUTES))
        result["write_s"] = round(result["write_s"] + last["write_s"], 2)
        result["seals"] += last["seals"]
        result["seal_max_ms"] = max(result["seal_max_ms"], last["seal_max_ms"])
        for key in ("loop_longest_stall_ms", "loop_longest_stall_in_seals_ms"):
            result[key] = max(result[key], last[key])

        def tick() -> None:
            for copy, live in ((first, checkpoint), (out / "stream-59", out / "stream")):
                shutil.rmtree(live)
                shutil.copytree(copy, live)
            stats.main([str(data), "--stream", "--checkpoint", str(checkpoint),
                        "--output", str(out / "stream")])
        result["stream_tick_s"] = round(statistics.median(timed(tick) for _ in range(repeat)), 2)
        result["stream_tick_reads"] = "the last minute (one generation per shard)"
    else:
        result |= write_hour(data, messages, False)

        def hour() -> None:
            shutil.rmtree(out / "ck", ignore_errors=True)
            shutil.rmtree(out / "stream", ignore_errors=True)
            stats.main([str(data), "--stream", "--checkpoint", str(out / "ck"),
                        "--output", str(out / "stream")])
        result["stream_tick_s"] = round(statistics.median(timed(hour) for _ in range(repeat)), 2)
        result["stream_tick_reads"] = "the hour (one generation per shard)"
    result |= on_disk(data)
    batch_s = statistics.median(timed(lambda: stats.main(
        [str(data), "--output", str(out / "batch")])) for _ in range(repeat))
    result["stats_batch_s"] = round(batch_s, 2)
    result["stats_batch_msgs_per_s"] = round(messages / batch_s)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=360_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rotations", type=int, default=10)
    args = parser.parse_args()
    messages = args.messages // MINUTES * MINUTES
    work = Path(tempfile.mkdtemp(prefix="generation-interval-"))
    try:
        load_before = os.getloadavg()[0]
        slabframe.session("bench", "local[2]", lean_jvm=True)  # warm: both pay no start-up
        runs = [measure(work, interval, messages, args.repeat) for interval in ("1m", "1h")]
        replicated = replicated_rotations(work / "raft", messages, args.rotations)
        results = {"messages_per_hour": messages, "shards": 4, "cores": os.cpu_count(),
                   "repeat": args.repeat, "runs": runs, "replicated_rotation": replicated,
                   "load_before": round(load_before, 2),
                   "load_after": round(os.getloadavg()[0], 2)}
        minute, hour = runs
        results["stats_batch_ratio_1m_to_1h"] = round(
            minute["stats_batch_msgs_per_s"] / hour["stats_batch_msgs_per_s"], 2)
        print(json.dumps(results, indent=1))
        (ROOT / "bench" / "generation_interval_results.json").write_text(
            json.dumps(results, indent=1) + "\n")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
