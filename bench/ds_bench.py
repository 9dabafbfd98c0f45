"""Durable Storage benchmark: our engine against raw plyvel writing and reading the same bytes.

    .venv/bin/python bench/ds_bench.py [--messages N] [--sync-messages N] [--output PATH]

Raw plyvel is the physical limit here: the same keys and values (taken from our slab after
our run), written in WriteBatches of the same size with the same sync flag, or iterated in
the same order without decoding. Each figure is reported as a ratio to that. One process,
one shard (so both sides drive one LevelDB), best of 3 alternating rounds, 100-byte
payloads, batches of 1000 messages awaited one after the other, topics
`bench/dev<0..49>/temp` (dev10.. share one LTS stream with an index key each).
The inputs (100k+ message objects, and for raw the key/value list) are built before the clock
starts and moved out of the garbage collector's view with gc.freeze(), for both sides: the
collector walking the benchmark's own fixtures is not a cost of either engine.
Writes results to bench/ds_results.json.
"""

import argparse
import asyncio
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import plyvel

from bench import report
from broker.ds import TTV, DurableStorage, Settings
from broker.ds.keys import DATA, timestamp_of

RESULTS = Path(__file__).resolve().parent / "ds_results.json"
BATCH = 1000
DEVICES = 50
PAYLOAD = bytes(100)


def messages(n: int) -> list[TTV]:
    return [TTV(f"bench/dev{i % DEVICES}/temp", PAYLOAD, 1, False, "bench-publisher")
            for i in range(n)]


async def write_ours(
    root: Path, batches: list[list[TTV]], sync: bool
) -> tuple[float, DurableStorage]:
    storage = DurableStorage(root, Settings(n_shards=1, max_items=BATCH))
    gc.collect()
    gc.freeze()
    started = time.perf_counter()
    for batch in batches:
        await storage.store_batch("messages", batch, sync)
    return time.perf_counter() - started, storage


def slab_batches(storage: DurableStorage) -> list[list[tuple[bytes, bytes]]]:
    """Our slab's data keys and values in the order and batches we wrote them: by timestamp
    (one per message), master key first, BATCH messages a batch. LevelDB is faster at keys
    that arrive sorted, so the order matters for a fair comparison."""
    slab = storage.messages.created_shards[0].current
    entries = sorted(slab.db.iterator(prefix=DATA), key=lambda e: (timestamp_of(e[0]), e[0][5]))
    batches: list[list[tuple[bytes, bytes]]] = []
    messages_in_batch = BATCH
    for key, value in entries:
        if value:  # a master key: a new message
            if messages_in_batch == BATCH:
                batches.append([])
                messages_in_batch = 0
            messages_in_batch += 1
        batches[-1].append((key, value))
    return batches


def write_raw(root: Path, batches: list[list[tuple[bytes, bytes]]], sync: bool) -> float:
    db = plyvel.DB(str(root), create_if_missing=True)
    gc.collect()
    gc.freeze()
    started = time.perf_counter()
    for entries in batches:
        with db.write_batch(sync=sync) as batch:
            for key, value in entries:
                batch.put(key, value)
    elapsed = time.perf_counter() - started
    db.close()
    return elapsed


def read_filter(storage: DurableStorage, topic_filter: str) -> int:
    """Messages read by draining an iterator over every matching stream."""
    count = 0
    for stream in storage.get_streams("messages", topic_filter):
        iterator = storage.make_iterator(stream, topic_filter)
        while iterator is not None:
            iterator, batch = storage.next(iterator, BATCH)
            if not batch:
                break
            count += len(batch)
    return count


def read_ours(storage: DurableStorage) -> tuple[float, int]:
    started = time.perf_counter()
    count = read_filter(storage, "bench/#")
    return time.perf_counter() - started, count


def read_raw(root: Path, master_keys: int) -> tuple[float, int]:
    db = plyvel.DB(str(root))
    started = time.perf_counter()
    count = 0
    for _key, _value in db.iterator():
        count += 1
        if count == master_keys:
            break
    elapsed = time.perf_counter() - started
    db.close()
    return elapsed, count


def wildcard(storage: DurableStorage) -> dict[str, Any]:
    """Keys visited to read one device that lives in the shared `bench/+/temp` stream."""
    before = storage.messages.keys_visited()
    count = read_filter(storage, "bench/dev42/#")
    visited = storage.messages.keys_visited() - before
    stream_size = storage.messages.created_shards[0].current.stats.messages
    return {"matches": count, "keys_visited": visited, "raw_full_scan_keys": stream_size,
            "ratio": round(visited / stream_size, 5)}


async def run(n: int, n_sync: int, rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {"messages": n, "sync_messages": n_sync, "batch": BATCH,
                               "payload_bytes": len(PAYLOAD), "rounds": rounds,
                               "machine": report.machine(), "build": report.build()}
    for sync, count in ((False, n), (True, n_sync)):
        best: dict[str, float] = {}
        for _ in range(rounds):  # alternating, best of each: the machine is shared
            work = Path(tempfile.mkdtemp(prefix="ds-bench-"))
            try:
                batches = [messages(BATCH) for _ in range(count // BATCH)]
                ours, storage = await write_ours(work / "ours", batches, sync)
                raw_batches = slab_batches(storage)
                assert len(raw_batches) == len(batches)
                raw = write_raw(work / "raw", raw_batches, sync)
                best["ours"] = min(best.get("ours", ours), ours)
                best["raw"] = min(best.get("raw", raw), raw)
                if not sync:
                    masters = count
                    ours_read, got = read_ours(storage)
                    raw_read, raw_got = read_raw(work / "raw", masters)
                    assert got == count == raw_got, (got, count, raw_got)
                    best["ours_read"] = min(best.get("ours_read", ours_read), ours_read)
                    best["raw_read"] = min(best.get("raw_read", raw_read), raw_read)
                    results["wildcard"] = wildcard(storage)
                    results["bytes"] = sum(len(k) + len(v) for b in raw_batches for k, v in b)
                await storage.close()
            finally:
                gc.unfreeze()
                shutil.rmtree(work)
        results["write_sync" if sync else "write_nosync"] = _figures(count, best, "ours", "raw")
        if not sync:
            results["read"] = _figures(count, best, "ours_read", "raw_read")
    return results


def _figures(count: int, best: dict[str, float], ours: str, raw: str) -> dict[str, Any]:
    return {"ours_msgs_per_s": round(count / best[ours]),
            "raw_msgs_per_s": round(count / best[raw]),
            "ratio": round(best[raw] / best[ours], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--sync-messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.messages, args.sync_messages, args.rounds))
    print("| measure | ours | raw plyvel | ours/raw |")
    print("|---|---|---|---|")
    for name, title in (("write_nosync", "batched writes, sync off (msgs/s)"),
                        ("write_sync", "batched writes, sync on (msgs/s)"),
                        ("read", "iterator reads (msgs/s)")):
        r = results[name]
        print(f"| {title} | {r['ours_msgs_per_s']:,} | {r['raw_msgs_per_s']:,} | {r['ratio']}x |")
    w = results["wildcard"]
    print(f"| wildcard `bench/dev42/#` (keys visited) | {w['keys_visited']:,} for"
          f" {w['matches']:,} matches | {w['raw_full_scan_keys']:,} (full scan) |"
          f" {w['ratio']} |")
    results["machine"]["loadavg_at_end"] = os.getloadavg()[0]
    args.output.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
