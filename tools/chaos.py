"""A long, seeded fault run (`make chaos`): a cluster of real nodes in a temporary directory,
the Jepsen-style workload of tests/cluster/jepsen/ running throughout, and one random fault
per cycle; at the end the history is checked and a summary printed.

    .venv/bin/python tools/chaos.py --cycles 100 --seed 7
    .venv/bin/python tools/chaos.py --cycles 20 --replicated --backend raft

Faults (tests/cluster/jepsen/faults.py): by default those `builtin_local` survives: kill -9
of a node holding no durable session (restarted on its data dir), SIGSTOP of one such node
or of a majority of them (SIGCONT after a few seconds, under the failure detector's
`node.dist_net_ticktime`). Every subscriber's session starts on n1. With --replicated,
also: kill -9 of every node at once (with builtin_local, a message acknowledged by a node
other than the session's in the last millisecond can be lost), kill -9 of n1 (restarted;
or with its data dir deleted), SIGSTOP of n1, one node isolated, one link cut (the nodes'
links then go through front doors the run controls). Those break the rules with
builtin_local; `--backend raft` runs the same on replicated Durable Storage.

Same seed, same choice of faults, targets and durations (the broker's timing still varies).
Every process is killed on exit, on an error and on Ctrl-C / SIGTERM. Exit status 0 when the
history holds every rule, 1 when not, 2 when the run itself failed.
"""

from __future__ import annotations

import argparse
import bisect
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.conftest import Cluster
from tests.cluster.jepsen.faults import (
    REPLICATED_ONLY,
    TODAY,
    Fault,
    pick_fault,
)
from tests.cluster.jepsen.harness import LOCAL, RAFT, Harness, backend, build
from tests.cluster.jepsen.history import Report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--replicated", action="store_true",
                        help="also the faults that need replicated Durable Storage")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--publishers", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=30.0,
                        help="messages per second and publisher")
    parser.add_argument("--steady", type=float, nargs=2, default=(1.0, 3.0),
                        metavar=("MIN", "MAX"), help="seconds of calm before each fault")
    parser.add_argument("--fault-seconds", type=float, nargs=2, default=(2.0, 5.0),
                        metavar=("MIN", "MAX"), help="seconds each fault lasts")
    parser.add_argument("--ticktime", default="10s",
                        help="node.dist_net_ticktime: a pause shorter than this is survived")
    parser.add_argument("--drain", type=float, default=60.0,
                        help="seconds to wait at the end for subscribers to catch up")
    parser.add_argument("--faults", default="",
                        help="comma-separated fault kinds to pick from (default: all that"
                        f" apply): {', '.join(TODAY + REPLICATED_ONLY)}")
    parser.add_argument("--backend", choices=("local", "raft"), default="local",
                        help="durable_storage.messages.backend: builtin_local or builtin_raft")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run's directory (data dirs, node logs, history) even"
                        " when every rule held")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 1 << 31)
    return args


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: a shell
        signal.signal(signum, _terminate)  # starts background jobs with it ignored
    rng = random.Random(args.seed)
    kinds = list(TODAY) + (list(REPLICATED_ONLY) if args.replicated else [])
    if args.faults:
        kinds = [kind.strip() for kind in args.faults.split(",") if kind.strip()]
        unknown = set(kinds) - set(TODAY + REPLICATED_ONLY)
        if unknown:
            print(f"chaos: unknown fault kinds {sorted(unknown)}", file=sys.stderr)
            return 2
    tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
    cluster = Cluster(tmp)
    harness: Harness | None = None
    cycles: list[Cycle] = []
    report: Report | None = None
    started = time.monotonic()
    status = 2
    interrupted = False
    again = " ".join([f"--seed {args.seed}", f"--cycles {args.cycles}",
                      f"--backend {args.backend}", *(["--replicated"] * args.replicated),
                      *([f"--faults {args.faults}"] if args.faults else [])])
    print(f"chaos: seed {args.seed} (again: tools/chaos.py {again}), {args.nodes} nodes in"
          f" {tmp}", flush=True)
    try:
        partitions = any(kind in ("isolate", "bridge") for kind in kinds)
        harness = build(cluster, args.nodes, doors=partitions,
                        **{"node.dist_net_ticktime": args.ticktime},
                        **backend(RAFT if args.backend == "raft" else LOCAL))
        names = [node.name for node in harness.nodes]
        workload = harness.workload(
            seed=args.seed, publishers=args.publishers, subscribers=args.subscribers,
            rate=args.rate, homes=[names[0]])
        workload.start()
        for cycle in range(1, args.cycles + 1):
            fault: Fault | None = None
            while fault is None:
                kind = rng.choice(kinds)
                fault = pick_fault(kind, names, {names[0]}, rng)
            calm, hold = rng.uniform(*args.steady), rng.uniform(*args.fault_seconds)
            workload.run_for(calm)
            cycle_record = Cycle(kind, fault.name, len(harness.recorder.events))
            cycles.append(cycle_record)
            began = time.monotonic()
            fault.inject(harness.nemesis)
            try:
                workload.run_for(hold)
            finally:
                fault.heal(harness.nemesis)
                cycle_record.healed = len(harness.recorder.events)
            missing = sum(workload.recorder.missing().values())
            print(f"cycle {cycle:3}/{args.cycles} {fault.name:24} held {hold:4.1f} s, healed"
                  f" after {time.monotonic() - began:4.1f} s; {len(harness.recorder.events)}"
                  f" events, {missing} deliveries pending", flush=True)
        workload.run_for(rng.uniform(*args.steady))
        report = workload.finish(drain_timeout=args.drain)
        stats = workload.stats
        print(f"clients: {stats.publisher_connections} publisher and"
              f" {stats.subscriber_connections} subscriber connections, {stats.redirects}"
              f" redirects (0x9C), {stats.refused} connections refused or unanswered")
        status = 0 if report.ok else 1
    except KeyboardInterrupt as stop:
        print(f"chaos: interrupted ({stop or 'Ctrl-C'}): stopping", flush=True)
        status, interrupted = 2, True
    except Exception as error:  # the run itself broke: say what, clean up, exit 2
        print(f"chaos: the run failed: {error!r}", flush=True)
        status = 2
    finally:
        if harness is not None:
            harness.close()
        cluster.stop_all()
        if report is None and harness is not None:
            report = harness.recorder.check()  # what happened until the stop
        if args.keep or (status != 0 and not interrupted):
            if harness is not None:
                harness.recorder.dump(tmp / "history.jsonl")
            for node in cluster.nodes:
                (tmp / f"{node.name}.log").write_text(node.process.log_text() + "\n")
            print(f"chaos: kept in {tmp}: history.jsonl (the clients' events, with wall-clock"
                  f" times), n*.log (the nodes' logs), n*/ (their data dirs)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if report is not None:
        print(summary(args, report, cycles, time.monotonic() - started, status,
                      interrupted))
    return status


@dataclass
class Cycle:
    kind: str
    name: str
    injected: int  # history length when the fault was injected
    healed: int = 1 << 62  # ... and once it was healed


def blame(cycles: list[Cycle], first_attempt: int) -> str:
    """The fault a lost message is put down to: the one going on when it was first sent,
    else the next one injected after that."""
    starts = [cycle.injected for cycle in cycles]
    at = bisect.bisect_right(starts, first_attempt) - 1
    if at >= 0 and first_attempt <= cycles[at].healed:
        return cycles[at].kind
    return cycles[at + 1].kind if at + 1 < len(cycles) else "(after the last fault)"


def summary(args: argparse.Namespace, report: Report, cycles: list[Cycle],
            seconds: float, status: int, interrupted: bool = False) -> str:
    lost_by_kind: Counter[str] = Counter(
        blame(cycles, first) for _s, _p, _q, first, _ack in report.lost_messages)
    runs = Counter(cycle.kind for cycle in cycles)
    width = max([len(k) for k in (*runs, *lost_by_kind)] + [18])
    lines = [
        "",
        f"chaos summary: seed {args.seed}, {len(cycles)} cycles, {args.nodes} nodes"
        f" ({'builtin_raft' if args.backend == 'raft' else 'builtin_local'}),"
        f" {args.publishers} publishers x {args.rate:g} msg/s, {args.subscribers} durable"
        f" subscribers, {seconds:.0f} s",
        "",
        f"{'cycles':<{width}} {len(cycles):>9}",
        f"{'attempted':<{width}} {report.attempted:>9}",
        f"{'acknowledged':<{width}} {report.acknowledged:>9}",
        f"{'unknown (no ack)':<{width}} {report.unknown:>9}",
        f"{'resent':<{width}} {report.resent:>9}   (by publishers, on a new connection)",
        f"{'delivered':<{width}} {report.delivered:>9}",
        f"{'lost':<{width}} {report.lost:>9}",
        f"{'reordered':<{width}} {report.reordered:>9}",
        f"{'duplicated QoS 1':<{width}} {report.qos1_duplicates:>9}   (allowed)",
        f"{'duplicated QoS 2':<{width}} {report.qos2_duplicates:>9}",
        f"{'  resent by client':<{width}} {report.resend_duplicates:>9}   (allowed)",
        f"{'missing DUP':<{width}} {report.missing_dup:>9}",
        f"{'unexpected':<{width}} {report.unexpected:>9}",
        f"{'sessions lost':<{width}} {report.sessions_lost:>9}",
        f"{'recovered':<{width}} {report.recovered:>9}   (unacknowledged, delivered anyway)",
        "",
        f"{'fault':<{width}} {'cycles':>9} {'lost':>9}   (lost: sent while it was on, or"
        " just before it)",
    ]
    for kind in sorted(set(runs) | set(lost_by_kind)):
        lines.append(f"{kind:<{width}} {runs.get(kind, 0):>9} {lost_by_kind.get(kind, 0):>9}")
    for rule, texts in report.examples.items():
        lines += [f"  {rule}: {text}" for text in texts]
    verdict = {0: "OK: every rule held", 1: "VIOLATIONS: " + ", ".join(
        f"{k}={v}" for k, v in report.violations().items()), 2: "the run did not finish" + (
        " (interrupted before the subscribers caught up: lost counts what was still on its"
        " way)" if interrupted else "")}
    lines += ["", f"result: {verdict[status]}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
