"""Graceful stop benchmark (issue 38): how long a QoS 1 publisher on a surviving node waits
while the node leading its messages' shard stops on SIGTERM, with the hand-over of Raft
leadership (`node.graceful_stop_timeout` 5s, the default) and without it (0).

    .venv/bin/python bench/graceful_stop_bench.py [--stops N] [--quick]

Per variant one fresh 3-node `builtin_raft` cluster (RF 3, 16 shards: replication_bench.py's
settings), each node a process on this machine, all on loopback; then `--stops` times (see
bench/README.md, "Graceful stop benchmark"): a probe (replication_bench.py's) publishes QoS 1,
one PUBLISH in flight, the next 1 ms after the previous was sent, through node n % 3 with a
client ID whose shard another node leads, to a topic an offline persistent session holds (so
each PUBACK waits for the shard's commit); that leader gets SIGTERM; the probe's PUBLISH ->
PUBACK times from 1 s before the signal to WINDOW_AFTER_EXIT s after the process exited are
the figures: the longest one (the stall), p99 and p50. Also the stop's duration (SIGTERM to
exit) and whether the shard's new leader was elected on TimeoutNow (its
`raft_transfer_elections_total` rose). The node is started again on its data and the cluster
settles before the next stop.
Writes bench/graceful_stop_results.json.
"""

import argparse
import contextlib
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, report
from bench.brokers import Running
from bench.replication_bench import (
    FAILOVER_LIMIT,
    FAILOVER_PROBE_INTERVAL,
    REPLICATED,
    Probe,
    Target,
    ours_target,
    percentile,
    raft_status,
    wait_for,
    wait_led,
)
from broker.cluster.ds_groups import shard_group

RESULTS = Path(__file__).resolve().parent / "graceful_stop_results.json"
VARIANTS = (("hand-over", "5s"), ("no hand-over", "0"))
BEFORE_SIGNAL = 1.0  # seconds of acknowledgements recorded before the SIGTERM
WINDOW_AFTER_EXIT = 3.0
"""Recorded after the process exited: past the default election timeout (1 s) and the first
retry of a command that went to the dead leader, so a stall that only starts at the exit
(no hand-over: the links drop then) is in the window whole."""


def transfer_elections(member: Running, group: int) -> float:
    """Elections the node started on a leader's TimeoutNow, in one group."""
    url = f"http://127.0.0.1:{member.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    sample = f'raft_transfer_elections_total{{group="{group}"}} '
    return next((float(line[len(sample):]) for line in text.splitlines()
                 if line.startswith(sample)), 0.0)


def probe_target(members: list[Running], n: int) -> Target:
    """The probe on node n % 3, else on the next one that does not lead every shard (after a
    few stops one node may lead them all: a stop hands its groups to the others, a restarted
    node leads none)."""
    for k in range(len(members)):
        with contextlib.suppress(StopIteration):
            return ours_target(members, n + k)
    raise RuntimeError("no node with a shard led by another node")


def stop_once(members: list[Running], n: int) -> dict[str, Any]:
    target = probe_target(members, n)
    node, victim = target.node, target.victim
    group = shard_group(int(target.what["shard"]))
    survivors = [m for m in members if m is not victim]
    before = {m.node: transfer_elections(m, group) for m in survivors}
    print(f"  stop {n + 1}: {target.what}, SIGTERM {victim.node} (probe on {node.node})",
          end=" ", flush=True)
    with Probe(node.port, target.probe_id, target.topic, FAILOVER_PROBE_INTERVAL) as probe:
        probe.recording = True
        time.sleep(BEFORE_SIGNAL)
        probe.check()
        if not probe.samples:
            raise RuntimeError(f"probe: no PUBACK in {BEFORE_SIGNAL} s from {node.node}")
        signalled = time.monotonic()
        os.kill(victim.pid, signal.SIGTERM)
        victim.proc.wait(FAILOVER_LIMIT)
        exited = time.monotonic()
        wait_for(lambda: probe.error is not None or probe.first_ack_after(
            exited + WINDOW_AFTER_EXIT) is not None, survivors, "PUBACKs after the exit",
            FAILOVER_LIMIT)
        probe.check()
    latencies = [acked - sent for sent, acked in probe.samples
                 if sent >= signalled - BEFORE_SIGNAL and sent <= exited + WINDOW_AFTER_EXIT]
    new_leader = next(m for m in survivors if m.node == target.leader())
    cell = {**target.what, "stopped": victim.node, "probe_node": node.node,
            "stop_s": round(exited - signalled, 3),
            "stall_s": round(max(latencies), 3),
            "p99_ms": round(percentile(latencies, 99) * 1000, 1),
            "p50_ms": round(percentile(latencies, 50) * 1000, 2),
            "publishes": len(latencies), "new_leader": new_leader.node,
            "elected_on_timeout_now": transfer_elections(new_leader, group)
            > before[new_leader.node]}
    brokers.restart(victim, signal.SIGTERM)
    wait_led(members)
    print(f"-> stall {cell['stall_s']} s, p99 {cell['p99_ms']} ms, stop {cell['stop_s']} s,"
          f" new leader {cell['new_leader']}"
          f"{' (TimeoutNow)' if cell['elected_on_timeout_now'] else ''}", flush=True)
    return cell


def run_variant(key: str, timeout: str, stops: int) -> dict[str, Any]:
    settings = {**REPLICATED, "node.graceful_stop_timeout": timeout}
    started = time.monotonic()
    out: dict[str, Any] = {"variant": key, "settings": settings}
    with brokers.running_cluster("ours", 3, settings) as members:
        wait_led(members)
        print(f"{key}: up in {time.monotonic() - started:.1f}s", flush=True)
        cells = [stop_once(members, n) for n in range(stops)]
        assert all(raft_status(m)["groups"] for m in members)
    stalls = [c["stall_s"] for c in cells]
    out.update({"stops": cells, "stall_p50_s": percentile(stalls, 50),
                "stall_max_s": max(stalls),
                "p99_ms_p50": percentile([c["p99_ms"] for c in cells], 50),
                "stop_s_p50": percentile([c["stop_s"] for c in cells], 50),
                "runtime_s": round(time.monotonic() - started, 1)})
    return out


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| variant | stall p50 / max (s) | p99 PUBACK, p50 of stops (ms) | stop p50 (s) "
            "| new leader on TimeoutNow |", "|---|---|---|---|---|"]
    for r in results:
        timeout_now = sum(c["elected_on_timeout_now"] for c in r["stops"])
        rows.append(f"| {r['variant']} | {r['stall_p50_s']} / {r['stall_max_s']} "
                    f"| {r['p99_ms_p50']} | {r['stop_s_p50']} "
                    f"| {timeout_now} of {len(r['stops'])} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, help="SIGTERMs per variant (5)")
    parser.add_argument("--quick", action="store_true", help="one stop per variant")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results JSON path")
    args = parser.parse_args(argv)
    stops = args.stops if args.stops is not None else 1 if args.quick else 5
    versions = {"ours": brokers.version("ours")}
    env = {**report.machine(), "broker_versions": versions, "protocol": "MQTT 3.1.1",
           "stops": stops, "probe_interval_s": FAILOVER_PROBE_INTERVAL,
           "before_signal_s": BEFORE_SIGNAL, "window_after_exit_s": WINDOW_AFTER_EXIT}
    print(f"{stops} stop(s) per variant; load average {os.getloadavg()[0]:.2f}", flush=True)
    results = []
    for key, timeout in VARIANTS:
        results.append(run_variant(key, timeout, stops))
        report.write_json({"environment": env, "variants": results}, args.output)
    env["loadavg_at_end"] = os.getloadavg()[0]
    report.write_json({"environment": env, "variants": results}, args.output)
    print(f"\n{table(results)}\n\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
