"""A long, seeded fault run (`make chaos`): a cluster of real nodes in a temporary directory,
the Jepsen-style workloads of tests/cluster/jepsen/ running throughout, and one random fault
per cycle; at the end the histories are checked and a summary printed.

    .venv/bin/python tools/chaos.py --cycles 100 --seed 7
    .venv/bin/python tools/chaos.py --cycles 20 --replicated --backend raft --workload shared

Workloads (`--workload`, both by default, side by side on the same cluster and faults, each
with its own publishers and history): `plain`, durable subscribers that each get every
message (workload.py); `shared`, the members of one durable shared subscription that share
them, now and then one of them ending its session (shared.py: every acknowledged message to
one member, but the QoS 1 deliveries of an ended member, and QoS 2 to one only).

Faults (tests/cluster/jepsen/faults.py): by default those `builtin_local` survives: kill -9
of a node holding no durable session (restarted on its data dir), SIGSTOP of one such node
or of a majority of them (SIGCONT after a few seconds, under the failure detector's
`node.dist_net_ticktime`). Every subscriber's and member's session starts on n1. With --replicated,
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
from tests.cluster.jepsen.history import Report, SharedReport
from tests.cluster.jepsen.workload import Workload, run_together

WORKLOADS = ("plain", "shared")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--replicated", action="store_true",
                        help="also the faults that need replicated Durable Storage")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--publishers", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=3)
    parser.add_argument("--workload", choices=(*WORKLOADS, "both"), default="both",
                        help="durable subscribers that each get every message (plain), the"
                        " members of a durable shared subscription (shared), or both at once")
    parser.add_argument("--members", type=int, default=3,
                        help="members of the shared subscription")
    parser.add_argument("--end-sessions", type=float, default=0.1,
                        help="share of a member's stays that end with its session ending")
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
    workloads: list[Workload] = []
    cycles: list[Cycle] = []
    reports: dict[str, Report] = {}
    started = time.monotonic()
    status = 2
    interrupted = False
    again = " ".join([f"--seed {args.seed}", f"--cycles {args.cycles}",
                      f"--backend {args.backend}", *(["--replicated"] * args.replicated),
                      *([f"--faults {args.faults}"] if args.faults else []),
                      *([f"--workload {args.workload}"] if args.workload != "both" else [])])
    print(f"chaos: seed {args.seed} (again: tools/chaos.py {again}), {args.nodes} nodes in"
          f" {tmp}", flush=True)
    try:
        partitions = any(kind in ("isolate", "bridge") for kind in kinds)
        harness = build(cluster, args.nodes, doors=partitions,
                        **{"node.dist_net_ticktime": args.ticktime},
                        **backend(RAFT if args.backend == "raft" else LOCAL))
        names = [node.name for node in harness.nodes]
        clients = {"seed": args.seed, "publishers": args.publishers, "rate": args.rate,
                   "homes": [names[0]]}
        if args.workload in ("plain", "both"):
            workloads.append(harness.workload(subscribers=args.subscribers, **clients))
        if args.workload in ("shared", "both"):
            workloads.append(harness.shared_workload(
                subscribers=args.members, end_sessions=args.end_sessions, **clients))
        for workload in workloads:
            workload.start()
        for cycle in range(1, args.cycles + 1):
            fault: Fault | None = None
            while fault is None:
                kind = rng.choice(kinds)
                fault = pick_fault(kind, names, {names[0]}, rng)
            calm, hold = rng.uniform(*args.steady), rng.uniform(*args.fault_seconds)
            run_together(workloads, calm)
            cycle_record = Cycle(kind, fault.name, time.time())
            cycles.append(cycle_record)
            began = time.monotonic()
            fault.inject(harness.nemesis)
            try:
                run_together(workloads, hold)
            finally:
                fault.heal(harness.nemesis)
                cycle_record.healed = time.time()
            pending = ", ".join(f"{w.pending()} {w.label}" for w in workloads)
            print(f"cycle {cycle:3}/{args.cycles} {fault.name:24} held {hold:4.1f} s, healed"
                  f" after {time.monotonic() - began:4.1f} s; deliveries pending: {pending}",
                  flush=True)
        run_together(workloads, rng.uniform(*args.steady))
        for workload in workloads:  # all stop publishing, then each catches up
            workload.stop_publishers()
        for workload in workloads:
            reports[workload.label] = workload.finish(drain_timeout=args.drain)
            stats = workload.stats
            print(f"{workload.label} clients: {stats.publisher_connections} publisher and"
                  f" {stats.subscriber_connections} subscriber connections,"
                  f" {stats.redirects} redirects (0x9C), {stats.refused} connections refused"
                  " or unanswered")
        status = 0 if all(report.ok for report in reports.values()) else 1
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
        for workload in workloads:  # what happened until the stop
            if workload.label not in reports:
                reports[workload.label] = workload.check()
        if args.keep or (status != 0 and not interrupted):
            if harness is not None:
                harness.dump_histories(tmp)
            for node in cluster.nodes:
                (tmp / f"{node.name}.log").write_text(node.process.log_text() + "\n")
            print(f"chaos: kept in {tmp}: history.jsonl, history-shared.jsonl (the clients'"
                  " events, with wall-clock times), n*.log (the nodes' logs), n*/ (their data"
                  " dirs)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if reports:
        times = {w.label: w.recorder.times for w in workloads}
        print(summary(args, reports, times, cycles, time.monotonic() - started, status,
                      interrupted))
    return status


@dataclass
class Cycle:
    kind: str
    name: str
    injected: float  # wall clock when the fault was injected
    healed: float = float("inf")  # ... and once it was healed


def blame(cycles: list[Cycle], first_attempt: float) -> str:
    """The fault a lost message is put down to (by the wall-clock time of its first
    Attempt): the one going on when it was first sent, else the next one injected after."""
    starts = [cycle.injected for cycle in cycles]
    at = bisect.bisect_right(starts, first_attempt) - 1
    if at >= 0 and first_attempt <= cycles[at].healed:
        return cycles[at].kind
    return cycles[at + 1].kind if at + 1 < len(cycles) else "(after the last fault)"


# The summary's figures, a line each: label | Report attribute | note. Shared-only ones show
# "-" for the plain workload, and the plain workload's order check "-" for the shared one.
# Two dots start a label indented under the one before.
ROWS = [[cell.strip().replace("..", "  ") for cell in line.split("|")] for line in """
attempted                | attempted         |
acknowledged             | acknowledged      |
unknown (no ack)         | unknown           |
resent                   | resent            | (by publishers, on a new connection)
delivered                | delivered         |
lost                     | lost              |
reordered                | reordered         |
duplicated QoS 1         | qos1_duplicates   | (allowed; at one subscriber / member)
duplicated QoS 2         | qos2_duplicates   |
..resent by client       | resend_duplicates | (allowed)
missing DUP              | missing_dup       |
unexpected               | unexpected        |
sessions lost            | sessions_lost     |
recovered                | recovered         | (unacknowledged, delivered anyway)
doubled across members   | doubled           | (QoS 1 at a second member, the first's session on)
allowed redeliveries     | redelivered       | (QoS 1 of an ended member's session, to another)
..with DUP               | wrong_dup         | (a redelivery is a first delivery: DUP 0)
QoS 2 doubles            | qos2_doubled      | (at a second member)
doubles resent by client | resend_doubled    | (allowed: two PUBLISHes)
sessions ended           | ended             | (by the shared workload: Clean Start 1)
QoS 2 dropped            | dropped           | (allowed: an ended member had them, unreleased)
QoS 2 dropped unseen     | dropped_unseen    | (allowed: an ended member may have held them unsent)
""".strip().splitlines()]


def _figure(report: Report, attribute: str) -> str:
    shared = isinstance(report, SharedReport)
    if not hasattr(report, attribute) or (shared and attribute == "reordered"):
        return "-"
    return str(getattr(report, attribute))


def summary(args: argparse.Namespace, reports: dict[str, Report],
            times: dict[str, list[float]], cycles: list[Cycle], seconds: float, status: int,
            interrupted: bool = False) -> str:
    labels = list(reports)
    lost_by_kind = {label: Counter(blame(cycles, times[label][first])
                                   for _s, _p, _q, first, _ack in report.lost_messages)
                    for label, report in reports.items()}
    runs = Counter(cycle.kind for cycle in cycles)
    kinds = sorted(set(runs).union(*lost_by_kind.values()))
    width = max([len(k) for k in kinds] + [len(row[0]) for row in ROWS])
    clients = {"plain": f"{args.subscribers} durable subscribers",
               "shared": f"{args.members} members of a durable shared subscription"}
    head = f"{'':<{width}} " + " ".join(f"{label:>9}" for label in labels)
    lines = [
        "",
        f"chaos summary: seed {args.seed}, {len(cycles)} cycles, {args.nodes} nodes"
        f" ({'builtin_raft' if args.backend == 'raft' else 'builtin_local'}), "
        + "; ".join(f"{label}: {args.publishers} publishers x {args.rate:g} msg/s,"
                    f" {clients[label]}" for label in labels) + f", {seconds:.0f} s",
        "",
        head,
        f"{'cycles':<{width}} {len(cycles):>9}",
    ]
    for title, attribute, note in ROWS:
        figures = [_figure(report, attribute) for report in reports.values()]
        if set(figures) != {"-"}:
            lines.append(f"{title:<{width}} " + " ".join(f"{f:>9}" for f in figures)
                         + (f"   {note}" if note else ""))
    lines += ["", f"{'fault':<{width}} {'cycles':>9} " + " ".join(
        f"{'lost ' + label:>12}" for label in labels)
        + "   (lost: sent while it was on, or just before it)"]
    for kind in kinds:
        lines.append(f"{kind:<{width}} {runs.get(kind, 0):>9} " + " ".join(
            f"{lost_by_kind[label].get(kind, 0):>12}" for label in labels))
    for label, report in reports.items():
        for rule, texts in report.examples.items():
            lines += [f"  {label} {rule}: {text}" for text in texts]
    violations = ", ".join(f"{label} {k}={v}" for label, report in reports.items()
                           for k, v in report.violations().items())
    verdict = {0: "OK: every rule held", 1: "VIOLATIONS: " + violations,
               2: "the run did not finish" + (
                   " (interrupted before the subscribers caught up: lost counts what was"
                   " still on its way)" if interrupted else "")}
    lines += ["", f"result: {verdict[status]}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
