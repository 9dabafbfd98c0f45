"""Replay benchmark (issue 41 item 1): a `$stream` replay from Durable Storage against the
drain of the same stored messages to a durable session.

    .venv/bin/python bench/replay_bench.py [--messages M] [--rounds R] [--quick] [--no-pin]

Each round on a fresh broker (see bench/README.md, "Replay benchmark"): a stream `bench`
on the benchmark topic is created over HTTP, one durable session (3.1.1, clean session 0,
QoS 1) subscribes to the topic and leaves, one publisher stores M QoS 1 messages (once:
the stream's and the session's filters match the same messages). Then, in the round's
order (alternating, so neither always reads a cache the other warmed):
  drain:  the session comes back and takes its M messages;
  replay: a new durable session subscribes to `$stream/bench` (no `stream-offset`:
          earliest) and takes the same M messages from storage.
Both acknowledge every PUBLISH (the loadgen's subscribers, the same code for both) and are
timed from the first CONNECT to the last delivery. The figure is replay rate / drain rate
per round and its median; the target is >= 1x. Also what the reads left in the broker's
memory: RSS, and its anonymous part (RSS counts the LevelDB table pages read through mmap,
which the kernel reclaims). Writes bench/replay_results.json.
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, durable_bench, procstat, report
from bench.scenarios import check_broker, settled_rss

RESULTS = Path(__file__).resolve().parent / "replay_results.json"
STREAM = "bench"


def _create_stream(broker: brokers.Running) -> None:
    """Over HTTP, which a broker opens just after its MQTT listeners (what `running` waits
    for): refused connections are retried for a while."""
    body = json.dumps({"name": STREAM, "topic_filter": durable_bench.TOPIC}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.http_port}/api/v5/message_streams", body, method="POST",
        headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 201, response.status
                return
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _replay(broker: brokers.Running, messages: int) -> dict[str, Any]:
    taken = durable_bench.drain(broker, 1, messages, f"$stream/{STREAM}", "bench-replay")
    return {"replay_" + key.removeprefix("drain_"): value for key, value in taken.items()}


def replay_round(messages: int, replay_first: bool) -> dict[str, Any]:
    with brokers.running("ours", persistent=True) as broker:
        _create_stream(broker)
        durable_bench.create_sessions(broker, 1)
        out: dict[str, Any] = {"replay_first": replay_first,
                               **durable_bench.publish(broker, messages)}
        before = settled_rss(broker.pid)
        anon = procstat.rss_kib(broker.pid, "RssAnon")
        steps = [lambda: _replay(broker, messages), lambda: durable_bench.drain(broker, 1,
                                                                                 messages)]
        for step in steps if replay_first else reversed(steps):
            out.update(step())
        out["rss_growth_reading_mib"] = round((settled_rss(broker.pid) - before) / 1024, 1)
        out["anon_growth_reading_mib"] = round(
            (procstat.rss_kib(broker.pid, "RssAnon") - anon) / 1024, 1)
        check_broker(broker)
    out["replay_over_drain"] = round(out["replay_deliveries_per_s"] / out["deliveries_per_s"], 3)
    return out | cpu_per_message(out, messages)


def cpu_per_message(cell: dict[str, Any], messages: int) -> dict[str, float]:
    """The broker's CPU per delivery of each read (microseconds): on a shared machine a
    steadier comparison than the rates, which the other load moves."""
    return {f"{read}_broker_us_per_msg": round(
                cell[f"{read}_broker_cpu"] * cell[f"{read}_s"] / messages * 1e6, 1)
            for read in ("replay", "drain")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000, help="stored messages")
    parser.add_argument("--rounds", type=int, default=4, help="fresh brokers, alternating")
    parser.add_argument("--quick", action="store_true", help="20,000 messages, 2 rounds")
    parser.add_argument("--no-pin", action="store_true",
                        help="let the OS schedule broker and generator on any CPU")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results JSON path")
    args = parser.parse_args(argv)
    brokers.set_pinning(not args.no_pin)
    messages, rounds = (20_000, 2) if args.quick else (args.messages, args.rounds)
    cells = []
    for number in range(rounds):
        print(f"round {number + 1}/{rounds}", end=" ", flush=True)
        cell = replay_round(messages, replay_first=number % 2 == 0)
        print({key: cell[key] for key in ("replay_deliveries_per_s", "deliveries_per_s",
                                          "replay_over_drain", "replay_verified",
                                          "drain_verified")}, flush=True)
        cells.append(cell)
    ratios = sorted(cell["replay_over_drain"] for cell in cells)
    summary = {"date": time.strftime("%Y-%m-%d"), "messages": messages,
               "pinned": brokers.pinned(), "loadavg_at_end": os.getloadavg()[0],
               "build": report.build(),
               "ratios": [cell["replay_over_drain"] for cell in cells],
               "median_ratio": ratios[(len(ratios) - 1) // 2],
               "verified": all(cell["replay_verified"] and cell["drain_verified"]
                               for cell in cells),
               "rounds": cells}
    report.write_json(summary, args.output)
    print(f"replay/drain median {summary['median_ratio']}x (target >= 1x),"
          f" verified {summary['verified']}; {args.output}")
    return 0 if summary["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
