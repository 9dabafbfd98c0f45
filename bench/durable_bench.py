"""Durable sessions benchmark (issue 4 item 8): ours against Mosquitto with persistence.

    .venv/bin/python bench/durable_bench.py [--quick] [--brokers ours,mosquitto]
                                            [--sessions N] [--messages M] [--no-pin]

Mosquitto runs with `persistence true`, `max_queued_messages 0` (no limit), so that, like
ours, it keeps every queued message of a persistent session and can keep them across a
restart. amqtt is left out: its sessions live in memory (the optional SessionDBPlugin keeps
subscriptions, not queued messages, across restarts) and it slows down by orders of
magnitude with a deep backlog, so a million queued messages would measure nothing useful.

Per broker, each on a fresh process (see bench/README.md, "Durable sessions benchmark"):
  queue:      N persistent sessions (3.1.1, clean session 0, QoS 1 on one topic) go offline,
              one publisher sends M QoS 1 messages: RSS growth and publishing time; then all
              sessions come back without subscribing and drain N x M deliveries.
  restart:    the same queue, then SIGTERM (and for ours, then kill -9) and a start on the
              same data: time to the first CONNACK; then the drain counts what was kept.
  throughput: QoS 1, 1 -> 1 into a persistent session, as scenario b of run.py, in
              THROUGHPUT_PAIRS rounds per broker, alternating brokers round by round; the
              figure is each broker's median round, and the ratio the median of the pairs'
              ratios (this host's speed drifts by 2x within minutes: one round each compared
              two different machines as often as two brokers).
Writes bench/durable_results.json.
"""

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, procstat, report, wire
from bench.loadgen import DRAIN_TIMEOUT, GO, PublisherSpec, Spec, SubscriberSpec
from bench.scenarios import (
    PAYLOAD,
    READY_TIMEOUT,
    Fleet,
    Scenario,
    Timing,
    check_broker,
    settled_rss,
    split,
    throughput,
    wait_until,
)

RESULTS = Path(__file__).resolve().parent / "durable_results.json"
ALL_BROKERS = ("ours", "mosquitto")
TOPIC = "bench/durable"
WINDOW = 500
SESSION_PROCS = 2
"""Generator processes holding the sessions: more would only compete for the same core."""
DRAIN_QUIET = 10.0
"""A drain that delivers nothing for this long is over: what arrived is what was kept."""
RESTART_SETTLE = 0.5
"""Pause between a restart and the kill -9 that follows it, so the kill finds the broker
idle with its queue on disk (the realistic case) rather than mid-start-up."""
THROUGHPUT = Scenario("f", "qos1_durable_1to1",
                      "QoS 1, 1 publisher -> 1 persistent-session subscriber",
                      qos=1, window=WINDOW, max_lag=800, clean=False)
LAYOUT = wire.publish_layout(TOPIC, PAYLOAD, 1)
THROUGHPUT_PAIRS = 5

Snapshot = tuple[float, float, float, float]  # monotonic, broker CPU, generator CPU, machine


def _snapshot(broker: brokers.Running, fleet: Fleet) -> Snapshot:
    return (time.monotonic(), procstat.cpu_seconds(broker.pid), fleet.cpu(),
            procstat.machine_busy_seconds())


def _cpu(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU use between two snapshots, in cores; `other_cpu` is load from other processes,
    which the machine is shared with."""
    seconds, broker, generator = (after[i] - before[i] for i in range(3))
    other = max(0.0, after[3] - before[3] - broker - generator)
    return {"broker_cpu": round(broker / seconds, 2),
            "generator_cpu": round(generator / seconds, 2),
            "other_cpu": round(other / seconds, 2)}


def _session_fleet(broker: brokers.Running, sessions: int, topic_filter: str | None,
                   expected: int = 0, prefix: str = "bench-durable") -> tuple[Fleet, range]:
    ids = [f"{prefix}-{i:05d}" for i in range(sessions)]
    specs: list[Spec] = [
        SubscriberSpec(broker.port, part, topic_filter, 1, LAYOUT, clean=False,
                       expected=expected)
        for part in split(ids, SESSION_PROCS)
    ]
    return Fleet(specs), range(len(specs))


def _watch(fleet: Fleet, broker: brokers.Running) -> Callable[[], None]:
    def watch() -> None:
        fleet.check()
        check_broker(broker)
    return watch


def create_sessions(broker: brokers.Running, sessions: int) -> float:
    """Sessions subscribe and leave with a DISCONNECT: offline, with a QoS 1 subscription."""
    fleet, slots = _session_fleet(broker, sessions, TOPIC)
    started = time.monotonic()
    try:
        fleet.start(slots)
        fleet.wait_ready(slots, broker, max(READY_TIMEOUT, sessions / 20))
        return time.monotonic() - started
    finally:
        fleet.close()


def publish(broker: brokers.Running, messages: int) -> dict[str, Any]:
    """One publisher, WINDOW unacknowledged: seconds until the last PUBACK."""
    spec = PublisherSpec(broker.port, ["bench-durable-pub"], [TOPIC], PAYLOAD, 1,
                         subscribers=0, max_lag=WINDOW, window=WINDOW, total=messages)
    fleet = Fleet([spec])
    sh = fleet.shared
    try:
        fleet.start(range(1))
        fleet.wait_ready(range(1), broker, READY_TIMEOUT)
        before = _snapshot(broker, fleet)
        sh.phase.value = GO
        wait_until(lambda: bool(sh.finished[0]), lambda: int(sh.acked[0]),
                   quiet=DRAIN_TIMEOUT, limit=600, watch=_watch(fleet, broker))
        after = _snapshot(broker, fleet)
        acked = sh.acked[0]
    finally:
        fleet.close()
    seconds = after[0] - before[0]
    return {"publish_s": round(seconds, 3), "published": acked,
            "publish_msgs_per_s": round(acked / seconds), "publish_verified": acked == messages,
            **{f"publish_{k}": v for k, v in _cpu(before, after).items()}}


def drain(broker: brokers.Running, sessions: int, messages: int,
          topic_filter: str | None = None, prefix: str = "bench-durable") -> dict[str, Any]:
    """All sessions come back (clean session 0, no SUBSCRIBE) and take their backlog,
    acknowledging each PUBLISH: seconds from the first CONNECT to the last delivery, and
    whether every session got exactly `messages`. With `topic_filter`, new sessions
    (`prefix`) subscribe to it and take what it gives (a `$stream` replay)."""
    expected = sessions * messages
    fleet, slots = _session_fleet(broker, sessions, topic_filter, expected=messages,
                                  prefix=prefix)
    sh = fleet.shared
    try:
        before = _snapshot(broker, fleet)
        fleet.start(slots)
        wait_until(lambda: sum(sh.delivered) >= expected, lambda: sum(sh.delivered),
                   quiet=DRAIN_QUIET, limit=1800, watch=_watch(fleet, broker))
        after = _snapshot(broker, fleet)
        time.sleep(0.5)  # duplicates, if any, would come right behind
    finally:
        fleet.close()
    delivered, mismatched = sum(sh.delivered), sum(sh.mismatched)
    seconds = after[0] - before[0]
    return {"drain_s": round(seconds, 3), "expected": expected, "delivered": delivered,
            "deliveries_per_s": round(delivered / seconds),
            "sessions_present": sum(sh.resumed), "sessions_not_exact": mismatched,
            "drain_verified": delivered == expected and mismatched == 0,
            **{f"drain_{k}": v for k, v in _cpu(before, after).items()}}


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


def queue_round(name: str, sessions: int, messages: int) -> dict[str, Any]:
    """Memory while sessions x messages are queued, publishing time, drain time."""
    with brokers.running(name, persistent=True) as broker:
        time.sleep(0.5)  # let start-up allocations settle before the baseline
        base = settled_rss(broker.pid)
        out: dict[str, Any] = {"create_sessions_s": round(create_sessions(broker, sessions), 3)}
        with_sessions = settled_rss(broker.pid)
        out.update(publish(broker, messages))
        queued = settled_rss(broker.pid)
        out.update({"rss_base_mib": _mib(base), "rss_sessions_mib": _mib(with_sessions),
                    "rss_queued_mib": _mib(queued), "rss_growth_mib": _mib(queued - base)})
        out.update(drain(broker, sessions, messages))
        check_broker(broker)
        return out


def restart_round(name: str, sessions: int, messages: int) -> dict[str, Any]:
    """The same queue, then restarts on the same data: SIGTERM, and for ours kill -9 too;
    the drain afterwards counts what survived."""
    with brokers.running(name, persistent=True) as broker:
        out: dict[str, Any] = {"empty_start_s": round(broker.ready_s, 3)}
        create_sessions(broker, sessions)
        out.update({f"restart_round_{k}": v for k, v in publish(broker, messages).items()})
        stop_s, start_s = brokers.restart(broker, signal.SIGTERM)
        out.update({"sigterm_stop_s": round(stop_s, 3), "sigterm_restart_s": round(start_s, 3)})
        if name == "ours":
            time.sleep(RESTART_SETTLE)
            _, start_s = brokers.restart(broker, signal.SIGKILL)
            out["kill9_restart_s"] = round(start_s, 3)
        out["rss_after_restart_mib"] = _mib(settled_rss(broker.pid))
        kept = drain(broker, sessions, messages)
        out.update({f"after_restart_{k}": v for k, v in kept.items()})
        check_broker(broker)
        return out


def throughput_round(name: str, timing: Timing) -> dict[str, Any]:
    with brokers.running(name, persistent=True) as broker:
        outcome = throughput(THROUGHPUT, broker, timing)
    d = outcome.details
    return {"throughput_msgs_per_s": round(d["deliveries_per_s"]),
            "throughput_verified": outcome.verified, "throughput_published": d["published"],
            "throughput_delivered": d["delivered"],
            **{f"throughput_{k}": round(d[k], 2)
               for k in ("broker_cpu", "generator_cpu", "other_cpu")}}


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median rate (the lower middle one of an even count), kept whole
    so its CPU figures describe the rate shown; verified only if every round was."""
    ranked = sorted(rounds, key=lambda cell: cell["throughput_msgs_per_s"])
    middle = dict(ranked[(len(ranked) - 1) // 2])
    middle["throughput_verified"] = all(cell["throughput_verified"] for cell in rounds)
    middle["throughput_rounds"] = [cell["throughput_msgs_per_s"] for cell in rounds]
    return middle


def summarize_throughput(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each broker's median round (or its first failure), and ours/mosquitto per
    interleaved pair with their median."""
    summary: dict[str, dict[str, Any]] = {}
    for name, cells in rounds.items():
        failed = [cell for cell in cells if "throughput_error" in cell]
        summary[name] = failed[0] if failed else median_round(cells)
    if "ours" in rounds and "mosquitto" in rounds:
        ratios = [round(a["throughput_msgs_per_s"] / b["throughput_msgs_per_s"], 3)
                  for a, b in zip(rounds["ours"], rounds["mosquitto"], strict=True)
                  if a.get("throughput_msgs_per_s") and b.get("throughput_msgs_per_s")]
        summary["ours"]["throughput_pair_ratios"] = ratios
        if ratios:
            median = sorted(ratios)[(len(ratios) - 1) // 2]
            summary["ours"]["throughput_median_pair_ratio"] = median
        # Pairs the machine disturbed (report.BUSY_MACHINE, as run.py warns): on this shared
        # host the load shows up as steal, in one broker's round and not the other's.
        summary["ours"]["throughput_noisy_pairs"] = [
            pair + 1 for pair, cells in enumerate(zip(rounds["ours"], rounds["mosquitto"],
                                                      strict=True))
            if max(cell.get("throughput_other_cpu", 0.0) for cell in cells)
            > report.BUSY_MACHINE
        ]
    return summary


def _measured(round_name: str, label: str,
              body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One round; a failure is recorded as its result, and the run goes on."""
    print(f"{round_name:>10} {label}", end=" ", flush=True)
    started, load = time.monotonic(), procstat.machine_busy_seconds()
    try:
        cell = body()
    except Exception as exc:
        cell = {f"{round_name}_error": f"{type(exc).__name__}: {exc}"}
    seconds = time.monotonic() - started
    cell[f"{round_name}_machine_cpu"] = round(
        (procstat.machine_busy_seconds() - load) / seconds, 2)
    print(cell, flush=True)
    return cell


def run(names: list[str], sessions: int, messages: int, timing: Timing,
        pairs: int = THROUGHPUT_PAIRS) -> dict[str, Any]:
    """Every round for every broker, round by round (so a drift of the machine's load hits
    all brokers alike); throughput rounds alternate brokers `pairs` times."""
    results: dict[str, dict[str, Any]] = {name: {} for name in names}
    for round_name, body in (("queue", queue_round), ("restart", restart_round)):
        for name in names:
            results[name].update(_measured(round_name, f"{name:<10}",
                                           partial(body, name, sessions, messages)))
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for pair in range(pairs):
        for name in names:
            rounds[name].append(_measured("throughput", f"{name:<10} {pair + 1}/{pairs}",
                                          partial(throughput_round, name, timing)))
    for name, cell in summarize_throughput(rounds).items():
        results[name].update(cell)
    return results


MEASURES: tuple[tuple[str, str, str, str], ...] = (
    # key, label, what the ratio ours/mosquitto should be, verification key
    ("rss_growth_mib", "RSS growth while queued (MiB)", "<= 0.10x", "publish_verified"),
    ("publish_s", "publish M msgs to N offline sessions (s)", "", "publish_verified"),
    ("drain_s", "drain N x M on reconnect (s)", "", "drain_verified"),
    ("deliveries_per_s", "drain rate (deliveries/s)", "", "drain_verified"),
    ("sigterm_stop_s", "SIGTERM to exit (s)", "", ""),
    ("empty_start_s", "start, empty data dir, to first CONNACK (s)", "", ""),
    ("sigterm_restart_s", "restart after SIGTERM to first CONNACK (s)", "ours < 2 s", ""),
    ("kill9_restart_s", "restart after kill -9 to first CONNACK (s)", "ours < 2 s", ""),
    ("rss_after_restart_mib", "RSS after restart, queue on disk (MiB)", "", ""),
    ("after_restart_delivered", "queued deliveries kept across restart", "", ""),
    ("after_restart_drain_s", "drain after restart (s)", "", "after_restart_drain_verified"),
    ("throughput_msgs_per_s", "durable QoS 1 1->1 throughput (msgs/s)", ">= 0.5x",
     "throughput_verified"),
)


def table(names: list[str], results: dict[str, dict[str, Any]]) -> str:
    header = ["measure", *names, *(["ours/mosquitto", "target"] if len(names) > 1 else [])]
    rows = [header]
    starred = False
    for key, label, target, check in MEASURES:
        row = [label]
        for name in names:
            value = results[name].get(key)
            text = "-" if value is None else f"{value:,}"
            if value is not None and check and not results[name].get(check):
                text += " *"
                starred = True
            row.append(text)
        if len(names) > 1:
            ours, peer = results["ours"].get(key), results["mosquitto"].get(key)
            ratio = ours / peer if ours is not None and peer else None
            if key == "throughput_msgs_per_s":  # the pairs' median, see the module docstring
                ratio = results["ours"].get("throughput_median_pair_ratio", ratio)
            row.append("-" if ratio is None else f"{ratio:.3f}x")
            row.append(target)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    errors = [f"  {name}: {v}" for name in names for k, v in results[name].items()
              if k.endswith("_error")]
    ratios = results.get("ours", {}).get("throughput_pair_ratios")
    if ratios:
        lines += ["", f"throughput ours/mosquitto per interleaved pair: {ratios} "
                      f"(the table shows their median)"]
    noisy = results.get("ours", {}).get("throughput_noisy_pairs")
    if noisy:
        lines += [f"warning: in throughput pairs {noisy} other processes (or the host: steal) "
                  f"kept more than {report.BUSY_MACHINE} CPUs busy; those ratios are noisy, "
                  f"rerun on a quiet machine"]
    if errors:
        lines += ["", "FAILED:", *errors]
    if starred:
        lines += ["", "* counts did not add up (*_verified, sessions_not_exact in the JSON)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, help="offline sessions (default 1000)")
    parser.add_argument("--messages", type=int, help="messages queued per session (1000)")
    parser.add_argument("--quick", action="store_true",
                        help="100 x 100, one throughput pair with a 1 s window: a smoke run")
    parser.add_argument("--pairs", type=int,
                        help=f"interleaved throughput rounds per broker ({THROUGHPUT_PAIRS})")
    brokers.add_arguments(parser, ALL_BROKERS, RESULTS)
    args = parser.parse_args(argv)
    names = brokers.chosen(args, ALL_BROKERS)
    default = 100 if args.quick else 1_000
    sessions, messages = args.sessions or default, args.messages or default
    timing = Timing(warmup=0.5 if args.quick else 2.0, duration=1.0 if args.quick else 5.0,
                    idle_connections=0)
    versions = {b: brokers.version(b) for b in names}
    print(f"brokers: {versions}; {sessions} sessions x {messages} messages; "
          f"load average {os.getloadavg()[0]:.2f}")
    env = report.environment(versions, timing, brokers.load_cpus())
    env.pop("idle_connections")
    env.update({"sessions": sessions, "messages_per_session": messages, "topic": TOPIC,
                "publisher_window": WINDOW})
    started = time.monotonic()
    pairs = args.pairs or (1 if args.quick else THROUGHPUT_PAIRS)
    env["throughput_pairs"] = pairs
    results = run(names, sessions, messages, timing, pairs)
    env["loadavg_at_end"] = os.getloadavg()[0]
    env["total_runtime_s"] = round(time.monotonic() - started, 1)
    report.write_json({"environment": env, "results": results}, args.output)
    print("\n" + table(names, results))
    print(f"\nwrote {args.output} in {env['total_runtime_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
