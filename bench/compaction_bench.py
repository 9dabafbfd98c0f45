"""Compaction benchmark: what `durable_storage.messages.compression` costs while a shard's
generation grows, ours with `snappy` against ours with `none`, the same messages.

    .venv/bin/python bench/compaction_bench.py [--messages N] [--streams S] [--rounds R]

One process, one shard, N messages in write batches of 250 without fsync (a replica applying
Raft entries, or a node whose log is the durable copy) on S topics `bench/dev<i>/temp`, each
its own LTS stream, taking turns as a fleet of devices does: every table LevelDB writes then
spans every stream's keys and overlaps the others (broker/ds/keys.py), so each compaction
rewrites them. Payloads are ~130-byte JSON readings with a random field, which snappy
shrinks by about a third. The CPU figure is the whole process's (LevelDB compacts on its own
thread), counted until that thread has been idle for half a second; the size is the slab's
tables on disk at that point. Settings alternate within each round; the figure is the median
round. Writes bench/compaction_results.json.
"""

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report
from broker.ds import TTV, DurableStorage, Settings

RESULTS = Path(__file__).resolve().parent / "compaction_results.json"
BATCH = 250
SETTINGS = ("snappy", "none")
IDLE = 0.5


def payloads(n: int = 4096) -> list[bytes]:
    rnd = random.Random(1)
    return [b'{"device":"dev%04d","temp":%.3f,"hum":%.2f,"seq":%d,"raw":"%s"}'
            % (i, rnd.uniform(-20, 40), rnd.uniform(0, 100), i, rnd.randbytes(24).hex().encode())
            for i in range(n)]


def _settled_cpu() -> float:
    """Process CPU once LevelDB's background compactions have stopped using any."""
    last = time.process_time()
    while True:
        time.sleep(IDLE)
        now = time.process_time()
        if now - last < 0.01:
            return now
        last = now


async def one(root: Path, compression: str, n: int, streams: int) -> dict[str, Any]:
    storage = DurableStorage(root, Settings(n_shards=1, compression=compression,
                                            max_items=BATCH, generation_max_size=1 << 40))
    bodies = payloads()
    topics = [f"bench/dev{i}/temp" for i in range(streams)]
    started, wall = time.process_time(), time.perf_counter()
    try:
        for b in range(n // BATCH):
            batch = [TTV(topics[m % streams], bodies[m % len(bodies)], 1, False, "bench")
                     for m in range(b * BATCH, (b + 1) * BATCH)]
            await storage.store_batch("messages", batch, False)
        written = time.perf_counter() - wall
        cpu = _settled_cpu() - started
        tables = sum(t.stat().st_size for t in root.rglob("*.ldb"))
    finally:
        await storage.close()
    return {"cpu_us_per_msg": round(cpu / n * 1e6, 2), "write_s": round(written, 1),
            "tables_mb": round(tables / 1e6)}


async def run(n: int, streams: int, rounds: int) -> dict[str, Any]:
    machine = report.machine()  # before the rounds: its date and load are the run's start
    per: dict[str, list[dict[str, Any]]] = {c: [] for c in SETTINGS}
    for r in range(rounds):
        for compression in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
            work = Path(tempfile.mkdtemp(prefix="compaction-bench-"))
            try:
                cell = await one(work, compression, n, streams)
            finally:
                shutil.rmtree(work)
            per[compression].append(cell)
            print(f"  round {r + 1} {compression:<6} {cell}", flush=True)
    median = {c: {key: statistics.median(cell[key] for cell in cells) for key in cells[0]}
              for c, cells in per.items()}
    return {"messages": n, "streams": streams, "batch": BATCH, "rounds": rounds,
            "machine": machine | {"loadavg_at_end": os.getloadavg()[0]},
            "build": report.build(), "median": median, "rounds_detail": per}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4_000_000)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.messages, args.streams, args.rounds))
    snappy, none = results["median"]["snappy"], results["median"]["none"]
    print("| measure | compression none | compression snappy | snappy/none |")
    print("|---|---|---|---|")
    for key, title in (("cpu_us_per_msg", "CPU per message, compactions included (us)"),
                       ("tables_mb", "tables on disk (MB)")):
        print(f"| {title} | {none[key]} | {snappy[key]} | {snappy[key] / none[key]:.2f}x |")
    report.write_json(results, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
