"""Start-up benchmark (issue 42): from the process's start to its first CONNACK, ours against
Mosquitto, on an empty data dir and on one holding a million queued deliveries.

    .venv/bin/python bench/startup_bench.py [--starts N] [--restarts N] [--sessions N]
                                            [--messages M] [--brokers ours,mosquitto]

empty:   `--starts` fresh brokers, each on an empty data dir (durable_bench.py's persistent
         configurations): the time from spawning the process to the first CONNACK of a
         probe that tries every 10 ms.
restart: N persistent sessions (3.1.1, clean session 0, QoS 1) go offline, one publisher
         sends them M QoS 1 messages (N x M queued deliveries), then the broker is stopped
         with SIGTERM and started on the same data `--restarts` times: the time from the
         new process's start to its first CONNACK, each time (nothing is drained, so every
         restart finds the same queue). A last start is checked to still hold the queue:
         a session resumes with Session Present and its first delivery.

Brokers take turns within each part, so a drift of the machine's load hits both alike; the
figures are medians, with the broker's CPU seconds at its first CONNACK (all its threads):
on a machine shared with other work the wall time is mostly a wait for a core. Writes
bench/startup_results.json.
"""

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, procstat, report
from bench.durable_bench import create_sessions, drain, publish

RESULTS = Path(__file__).resolve().parent / "startup_results.json"
ALL_BROKERS = ("ours", "mosquitto")
STARTS = 7
RESTARTS = 5


def _cpu(broker: brokers.Running) -> float:
    """The broker's CPU seconds so far (all its threads): on a machine shared with other
    work, the wall time to the first CONNACK is mostly waiting for a core; this is not."""
    return round(procstat.cpu_seconds(broker.pid), 3)


def empty_starts(names: list[str], starts: int) -> dict[str, dict[str, list[float]]]:
    seconds: dict[str, dict[str, list[float]]] = {name: {"s": [], "cpu_s": []}
                                                  for name in names}
    for _ in range(starts):
        for name in names:
            with brokers.running(name, persistent=True) as broker:
                seconds[name]["cpu_s"].append(_cpu(broker))
                seconds[name]["s"].append(round(broker.ready_s, 3))
    return seconds


def restarts(name: str, sessions: int, messages: int, times: int) -> dict[str, Any]:
    """The queue, then `times` SIGTERM restarts; the last start drains one session's worth
    to show the queue was kept (a broker that lost it would start faster)."""
    with brokers.running(name, persistent=True) as broker:
        create_sessions(broker, sessions)
        published = publish(broker, messages)
        seconds, cpu = [], []
        for _ in range(times):
            _, start_s = brokers.restart(broker, signal.SIGTERM)
            cpu.append(_cpu(broker))
            seconds.append(round(start_s, 3))
        kept = drain(broker, 1, messages)
    return {"restart_s": seconds, "restart_cpu_s": cpu, "published": published["published"],
            "one_session_kept": kept["delivered"], "queued": sessions * messages}


def _summary(cell: dict[str, Any]) -> str:
    return (f"empty start {cell['empty_start_median_s']:.3f} s"
            f" ({cell['empty_start_median_cpu_s']:.3f} s of CPU), restart with"
            f" {cell['queued']:,} queued {cell['restart_median_s']:.3f} s"
            f" ({cell['restart_median_cpu_s']:.3f} s of CPU) (medians)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=STARTS, help="empty starts per broker")
    parser.add_argument("--restarts", type=int, default=RESTARTS, help="restarts per broker")
    parser.add_argument("--sessions", type=int, default=1000, help="offline sessions")
    parser.add_argument("--messages", type=int, default=1000, help="messages queued per session")
    brokers.add_arguments(parser, ALL_BROKERS, RESULTS)
    args = parser.parse_args(argv)
    names = brokers.chosen(args, ALL_BROKERS)
    versions = {name: brokers.version(name) for name in names}
    print(f"brokers: {versions}; load average {os.getloadavg()[0]:.2f}")
    env: dict[str, Any] = {
        **report.machine(), "broker_versions": versions,
        "broker_cpu_pinned": brokers.BROKER_CPU if brokers.pinned() else None,
        "load_generator_cpus": sorted(brokers.load_cpus()),
        "sessions": args.sessions, "messages_per_session": args.messages,
        "starts": args.starts, "restarts": args.restarts}
    started = time.monotonic()
    empty = empty_starts(names, args.starts)
    print(f"empty data dir, seconds to the first CONNACK: {empty}", flush=True)
    results: dict[str, Any] = {}
    for name in names:
        restarted = restarts(name, args.sessions, args.messages, args.restarts)
        print(f"{name}: after SIGTERM with {restarted['queued']:,} queued: {restarted}",
              flush=True)
        results[name] = {"empty_start_s": empty[name]["s"],
                         "empty_start_median_s": statistics.median(empty[name]["s"]),
                         "empty_start_cpu_s": empty[name]["cpu_s"],
                         "empty_start_median_cpu_s": statistics.median(empty[name]["cpu_s"]),
                         **restarted,
                         "restart_median_s": statistics.median(restarted["restart_s"]),
                         "restart_median_cpu_s": statistics.median(restarted["restart_cpu_s"])}
    report.finish(env, results, args.output, started, _summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
