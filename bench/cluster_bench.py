"""Cluster benchmark (issue 16): ours as a 3- and a 5-node cluster against RabbitMQ 3.10's MQTT
plugin as a 3-node cluster, every node a process on this machine, all on loopback.

    .venv/bin/python bench/cluster_bench.py [--quick] [--brokers ours,rabbitmq] [--nodes 3,5]
                                            [--rabbitmq-nodes 3] [--duration S] [--pairs N]

One fresh cluster per broker and size, reused by its rounds; the publisher is always on the
first node (see bench/README.md, "Cluster benchmark"):
  same:   QoS 1, 1 -> 1, the subscriber on the publisher's node;
  cross:  QoS 1, 1 -> 1, the subscriber on the second node;
  both:   QoS 1, 1 -> 2, one subscriber on each of those two nodes: the publisher's node does
          what it does in `same` plus one forward, so the difference is what forwarding costs it;
  fanout: QoS 0, 1 -> 100 subscribers dealt round-robin over every node.
same, cross and both run in turn, `--pairs` times: this host's speed drifts within minutes, so
cross/same is the median of the ratios of rounds run side by side, and every other figure the
median round. CPU per message is each node's utime+stime (/proc) over the measured window
divided by the messages that went through in it. Writes bench/cluster_results.json.
"""

import argparse
import contextlib
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, procstat, report, wire
from bench.brokers import Running
from bench.loadgen import DRAIN_TIMEOUT, GO, STOP, PublisherSpec, Shared, Spec, SubscriberSpec
from bench.scenarios import (
    PAYLOAD,
    READY_TIMEOUT,
    Fleet,
    Timing,
    check_broker,
    split,
    wait_until,
)

RESULTS = Path(__file__).resolve().parent / "cluster_results.json"
ALL_BROKERS = ("ours", "rabbitmq")
WINDOW, QOS1_MAX_LAG = 500, 800
"""As scenario b of run.py: a publisher window that keeps any broker busy, a lag cap that
keeps queues from growing."""
FANOUT = 100
FANOUT_MAX_LAG = 250
"""QoS 0 fan-out's cap, in messages (x100 deliveries). A fan-out subscriber process reads
its sockets every loadgen.COALESCE (10 ms), so the cap bounds the rate at cap / 10 ms: run.py's
100 (QOS0_MAX_LAG_DELIVERIES / 100) held ours at ~10k msgs/s with its nodes at 0.3 cores.
250 keeps a node's subscribers under ours' mqtt.max_mqueue_len (1000) even if all of them
fall 3 x behind the average, as a third of the subscribers can at 3 nodes."""
PAIRS = 3
PUB_PROCS = 2
"""Generator processes of a placement with many publishers, as scenario d of run.py."""
ROUTES_TIMEOUT = 15.0
CROSS_TARGET = 0.5


@dataclass(frozen=True, slots=True)
class Placement:
    key: str
    title: str
    qos: int
    subscribers: tuple[int, ...]  # the node of each subscriber connection
    publishers: int = 1  # > 1: one topic each, under a wildcard every subscriber has
    window: int = WINDOW  # QoS 1 unacknowledged PUBLISHes per publisher connection
    clean: bool = True  # False: persistent sessions (replication_bench.py)

    @property
    def remote_nodes(self) -> int:
        """Nodes the publisher's node (node 0) must forward each message to."""
        return len(set(self.subscribers) - {0})


def placements(nodes: int) -> tuple[Placement, ...]:
    return (
        Placement("same", "QoS 1, 1 -> 1, one node", 1, (0,)),
        Placement("cross", "QoS 1, 1 -> 1, two nodes", 1, (1,)),
        Placement("both", "QoS 1, 1 -> 2, local + remote", 1, (0, 1)),
        Placement("fanout", f"QoS 0, 1 -> {FANOUT} over {nodes} nodes", 0,
                  tuple(i % nodes for i in range(FANOUT))),
    )


def metrics(member: Running, *names: str) -> dict[str, float]:
    """Sums of families' samples, all labels, from one read of ours' /metrics."""
    url = f"http://127.0.0.1:{member.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    sums = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if (name := line.split("{", 1)[0].split(" ", 1)[0]) in sums:
            sums[name] += float(line.rsplit(" ", 1)[1])
    return sums


def metric(member: Running, name: str) -> float:
    """Sum of a family's samples, all labels, from ours' /metrics."""
    return metrics(member, name)[name]


def _routes_settled(publisher: Running, remote_nodes: int, watch: Callable[[], None]) -> None:
    """Ours announces routes asynchronously: a PUBLISH before the publisher's node has the
    subscriber node's route is not forwarded. One route per node with a subscriber (the
    same filter), and none left over from the previous round, whose topic was another."""
    wait_until(lambda: metric(publisher, "mqtt_cluster_routes") == remote_nodes,
               lambda: 0, quiet=ROUTES_TIMEOUT, limit=ROUTES_TIMEOUT, watch=watch)
    if (seen := metric(publisher, "mqtt_cluster_routes")) != remote_nodes:
        raise RuntimeError(f"{publisher.node} has {seen:.0f} remote routes, expected "
                           f"{remote_nodes}, after {ROUTES_TIMEOUT:.0f}s")


def _forwarded(publisher: Running) -> float:
    return metric(publisher, "mqtt_cluster_forwarded_messages_total")


@dataclass(frozen=True, slots=True)
class Cluster:
    """What the rounds need to know of a broker beyond its members."""

    routes_settled: Callable[[Running, int, Callable[[], None]], None] | None
    forwarded: Callable[[Running], float] | None


CLUSTERS = {
    "ours": Cluster(_routes_settled, _forwarded),
    # RabbitMQ adds a subscription's binding in a cluster-wide transaction before the SUBACK,
    # and has no counter of messages sent to other nodes without the management plugin.
    "rabbitmq": Cluster(None, None),
}

Snapshot = tuple[float, int, int, list[float], float, float]
"""monotonic, delivered, sent, CPU seconds per node, generator CPU, machine busy seconds"""


def _snapshot(members: list[Running], fleet: Fleet) -> Snapshot:
    sh = fleet.shared
    return (time.monotonic(), sum(sh.delivered), sum(sh.sent),
            [procstat.cpu_seconds(m.pid) for m in members], fleet.cpu(),
            procstat.machine_busy_seconds())


def _per_message(seconds: float, messages: float) -> float | None:
    return round(seconds / messages * 1e6, 2) if messages else None


@dataclass(frozen=True, slots=True)
class Load:
    """What a round runs: `specs` are its subscribers' (the first `subscribers` of them), then
    its publishers'; `copies` is how many deliveries each published message makes (one per
    subscriber; one for a shared group, whatever its members)."""

    specs: list[Spec]
    subscribers: int
    copies: int
    qos: int


@dataclass(frozen=True, slots=True)
class Driven:
    """What `drive` counted: the window's snapshots, the totals after the drain (deliveries
    counted from the publishers' start), and the generator's counters."""

    before: Snapshot
    after: Snapshot
    published: int
    delivered: int
    unacked: int
    delivered_per_slot: list[int]
    shared: Shared


Settle = Callable[[Shared, Callable[[], None]], None]
"""Called once the subscribers are ready, before any publisher connects: waits until the
brokers route to them (given the counters and a watch that raises when a worker or a node
died)."""


def drive(load: Load, members: list[Running], timing: Timing, settle: Settle | None = None,
          window: contextlib.AbstractContextManager[Any] | None = None) -> Driven:
    """One round of `load`: subscribers connect and subscribe, `settle`, publishers connect,
    all go; snapshots around the window after the warm-up (`window` is entered for it
    alone, and QoS 1 publishers time PUBACKs in it), then publishers stop, their
    acknowledgements and the deliveries are awaited."""
    fleet = Fleet(load.specs)
    sh = fleet.shared
    sub_slots, pub_slots = range(load.subscribers), range(load.subscribers, len(load.specs))

    def watch() -> None:
        fleet.check()
        for member in members:
            check_broker(member)

    def pause(seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(0.1, left))
            watch()

    try:
        fleet.start(sub_slots)
        fleet.wait_ready(sub_slots, members[0], READY_TIMEOUT)
        if settle is not None:
            settle(sh, watch)
        fleet.start(pub_slots)
        fleet.wait_ready(pub_slots, members[0], READY_TIMEOUT)
        settled = sum(sh.delivered)  # what settling made the subscribers receive
        sh.phase.value = GO
        pause(timing.warmup)
        before = _snapshot(members, fleet)
        sh.recording.value = 1
        with window or contextlib.nullcontext():
            pause(timing.duration)
        sh.recording.value = 0
        after = _snapshot(members, fleet)
        sh.phase.value = STOP
        wait_until(lambda: all(sh.finished[s] for s in pub_slots), lambda: sum(sh.acked),
                   quiet=DRAIN_TIMEOUT, limit=DRAIN_TIMEOUT + 5, watch=watch)
        published = sum(sh.acked) if load.qos else sum(sh.sent)
        expected = published * load.copies + settled
        wait_until(lambda: sum(sh.delivered) >= expected, lambda: sum(sh.delivered),
                   quiet=3.0 if load.qos else 1.0, limit=20.0, watch=watch)
        delivered = list(sh.delivered[: load.subscribers])
    finally:
        fleet.close()
    unacked = sum(sh.sent) - sum(sh.acked) if load.qos else 0
    return Driven(before, after, published, sum(delivered) - settled, unacked, delivered, sh)


def figures(run: Driven, load: Load) -> dict[str, Any]:
    """Rates and CPU over the window, counts verified as in run.py (QoS 1: delivered ==
    acknowledged x copies, nothing unacknowledged; QoS 0: the shortfall is `lost`)."""
    before, after = run.before, run.after
    window = after[0] - before[0]
    deliveries = after[1] - before[1]
    messages = deliveries / load.copies  # through the cluster in the window, to everyone
    node_cpu = [b - a for a, b in zip(before[3], after[3], strict=True)]
    generator = after[4] - before[4]
    expected = run.published * load.copies
    lost = expected - run.delivered
    return {
        "msgs_per_s": round(messages / window),
        "deliveries_per_s": round(deliveries / window),
        "published_per_s": round((after[2] - before[2]) / window),
        "window_s": round(window, 3),
        "published": run.published,
        "expected_deliveries": expected,
        "delivered": run.delivered,
        "lost": max(lost, 0),
        "duplicates": max(-lost, 0),
        "unacked_by_broker": run.unacked,
        "verified": lost == 0 and run.unacked == 0,
        "node_cpu": [round(c / window, 3) for c in node_cpu],
        "cpu_us_per_msg": [_per_message(c, messages) for c in node_cpu],
        "cluster_cpu_us_per_msg": _per_message(sum(node_cpu), messages),
        "cluster_cpu_us_per_delivery": _per_message(sum(node_cpu), deliveries),
        "generator_cpu": round(generator / window, 3),
        "other_cpu": round(max(0.0, after[5] - before[5] - sum(node_cpu) - generator) / window,
                           3),
        "slow_path": bool(any(run.shared.slow_path)),
    }


def measure(pl: Placement, members: list[Running], timing: Timing, label: str,
            window: contextlib.AbstractContextManager[Any] | None = None) -> dict[str, Any]:
    """One round (`drive`): subscribers on their nodes, the publishers on node 0; for ours,
    publishing starts once node 0 has the routes to the subscribers' nodes, and every
    message must have been forwarded once per remote node with a subscriber.
    `window`: replication_bench.py's latency probe, which records only then."""
    publisher, cluster = members[0], CLUSTERS[members[0].name]
    topic = f"bench/cluster/{label}"
    topics = ([topic] if pl.publishers == 1 else
              [f"{topic}/{i:03d}" for i in range(pl.publishers)])
    layout = wire.publish_layout(topics[0], PAYLOAD, pl.qos)
    subscribers = len(pl.subscribers)
    by_node: dict[int, list[str]] = {}
    for i, node in enumerate(pl.subscribers):
        by_node.setdefault(node, []).append(f"bench-{label}-sub{i}")
    sub_nodes = sorted(by_node)
    topic_filter = topic if pl.publishers == 1 else f"{topic}/+"
    specs: list[Spec] = [SubscriberSpec(members[node].port, by_node[node], topic_filter, pl.qos,
                                        layout, clean=pl.clean)
                         for node in sub_nodes]
    # The gate compares what was sent with the subscribers' average progress, so one of n
    # subscribers may fall up to n x max_lag behind: QoS 1's cap is shared out so that no
    # subscriber's backlog reaches ours' mqtt.max_mqueue_len (1000), past which a clean
    # session's oldest queued message is dropped (`both` lost a few hundred at 800 each).
    max_lag = QOS1_MAX_LAG // subscribers if pl.qos else FANOUT_MAX_LAG
    pub_ids = publisher_ids(label, pl.publishers)
    by_id = dict(zip(pub_ids, topics, strict=True))
    parts = split(pub_ids, PUB_PROCS)
    specs += [PublisherSpec(publisher.port, ids, [by_id[i] for i in ids], PAYLOAD, pl.qos,
                            subscribers=subscribers, max_lag=max_lag, peers=len(parts),
                            window=pl.window if pl.qos else 0,
                            chunk=min(500, max(1, max_lag // 4)))
              for ids in parts]
    load = Load(specs, len(sub_nodes), subscribers, pl.qos)
    forwarded_before = 0.0

    def settle(shared: Shared, watch: Callable[[], None]) -> None:
        nonlocal forwarded_before
        if cluster.routes_settled is not None:
            cluster.routes_settled(publisher, pl.remote_nodes, watch)
        forwarded_before = cluster.forwarded(publisher) if cluster.forwarded else 0.0

    run = drive(load, members, timing, settle, window)
    forwarded = cluster.forwarded(publisher) - forwarded_before if cluster.forwarded else None
    per_node = dict(zip(sub_nodes, run.delivered_per_slot, strict=True))
    expected_forwards = run.published * pl.remote_nodes
    out = figures(run, load)
    out["verified"] = out["verified"] and forwarded in (None, expected_forwards)
    return {
        **out,
        "delivered_per_node": [per_node.get(node, 0) for node in range(len(members))],
        # ours: messages the publisher's node sent to other nodes during the round (its
        # counter), which must be each published message once per remote node with a route
        "forwarded": forwarded,
        "expected_forwards": expected_forwards,
    }


def _median(values: Sequence[float]) -> float:
    """The lower middle value: with an even count, a figure that was measured."""
    return sorted(values)[(len(values) - 1) // 2]


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median rate, whole, so its CPU figures describe the rate shown;
    verified only if every round was."""
    middle = dict(sorted(rounds, key=lambda r: r["msgs_per_s"])[(len(rounds) - 1) // 2])
    middle["verified"] = all(r["verified"] for r in rounds)
    middle["rounds_msgs_per_s"] = [r["msgs_per_s"] for r in rounds]
    return middle


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per placement its median round; per pair of rounds run side by side cross/same, the
    forwarding cost on the publisher's node (both - same, node 0's CPU per message) and the
    hop's cost to the whole cluster (cross - same, all nodes' CPU per message); their
    medians. Failed rounds are listed, not averaged in."""
    out: dict[str, Any] = {}
    errors = [r["error"] for cells in rounds.values() for r in cells if "error" in r]
    if errors:
        out["errors"] = errors
    good = {key: [r for r in cells if "error" not in r] for key, cells in rounds.items()}
    for key, cells in good.items():
        if cells:
            out[key] = median_round(cells)
    derived: dict[str, list[float]] = {"cross_over_same": [], "forward_us": [], "hop_us": []}
    for same, cross, both in zip(rounds["same"], rounds["cross"], rounds["both"], strict=True):
        if any("error" in cell for cell in (same, cross, both)):
            continue
        if same["msgs_per_s"]:
            derived["cross_over_same"].append(round(cross["msgs_per_s"] / same["msgs_per_s"], 3))
        if None not in (same["cpu_us_per_msg"][0], both["cpu_us_per_msg"][0]):
            derived["forward_us"].append(
                round(both["cpu_us_per_msg"][0] - same["cpu_us_per_msg"][0], 2))
        if None not in (same["cluster_cpu_us_per_msg"], cross["cluster_cpu_us_per_msg"]):
            derived["hop_us"].append(
                round(cross["cluster_cpu_us_per_msg"] - same["cluster_cpu_us_per_msg"], 2))
    for name, values in derived.items():
        out[f"{name}_pairs"] = values
        out[name] = _median(values) if values else None
    out["noisy_rounds"] = sum(r.get("other_cpu", 0.0) > report.BUSY_MACHINE
                              for cells in good.values() for r in cells)
    out["unverified_rounds"] = sum(not r["verified"] for cells in good.values() for r in cells)
    out["rounds"] = rounds  # every round whole: a median hides which round did not add up
    return out


def run_cluster(name: str, nodes: int, timing: Timing, pairs: int) -> dict[str, Any]:
    """A fresh cluster; same/cross/both in turn `pairs` times, then the fan-out once; a
    round that fails is recorded and the others go on (a cluster that fails to start or
    dies fails them all)."""
    config = f"{name}{nodes}"
    shape = placements(nodes)
    rounds: dict[str, list[dict[str, Any]]] = {pl.key: [] for pl in shape}
    started = time.monotonic()
    try:
        with brokers.running_cluster(name, nodes) as members:
            print(f"{name} x{nodes}: up in {time.monotonic() - started:.1f}s "
                  f"(pids {[m.pid for m in members]})", flush=True)
            schedule = [(pair, pl) for pair in range(pairs) for pl in shape
                        if pl.key != "fanout"] + [(0, shape[-1])]
            for pair, pl in schedule:
                cell = run_round(pl, members, timing, f"{config}-{pl.key}-{pair + 1}")
                rounds[pl.key].append(cell)
    except Exception as exc:
        failed = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{name} x{nodes}: FAILED {failed['error'][:300]}", flush=True)
        for pl in shape:
            rounds[pl.key] += [failed] * ((1 if pl.key == "fanout" else pairs)
                                          - len(rounds[pl.key]))
    summary = summarize(rounds)
    summary.update({"broker": name, "nodes": nodes,
                    "runtime_s": round(time.monotonic() - started, 1)})
    return summary


def publisher_ids(label: str, publishers: int) -> list[str]:
    return ([f"bench-{label}-pub"] if publishers == 1 else
            [f"bench-{label}-pub{i}" for i in range(publishers)])


def attempt(label: str, members: list[Running],
            body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A round's `body` after its label is printed; a round that fails is returned as
    {"error": ...} unless a node died, which ends the cluster's rounds (the exception)."""
    print(f"  {label:<22}", end=" ", flush=True)
    try:
        return body()
    except Exception as exc:
        if dead := [m for m in members if not m.alive()]:
            raise RuntimeError(f"{dead[0].node or dead[0].name} died: {exc}") from exc
        cell = {"error": f"{label}: {type(exc).__name__}: {exc}"}
        print(f"FAILED {cell['error'][:300]}", flush=True)
        return cell


def run_round(pl: Placement, members: list[Running], timing: Timing, label: str,
              window: contextlib.AbstractContextManager[Any] | None = None) -> dict[str, Any]:
    """`measure` (`attempt`), printed as it ends."""
    cell = attempt(label, members, lambda: measure(pl, members, timing, label, window))
    if "error" in cell:
        return cell
    cpu = "/".join("-" if us is None else f"{us:.1f}" for us in cell["cpu_us_per_msg"])
    counts = "ok" if cell["verified"] else (
        f"COUNTS DO NOT ADD UP: lost {cell['lost']}, duplicates {cell['duplicates']}, "
        f"unacked {cell['unacked_by_broker']}, forwarded {cell['forwarded']} of "
        f"{cell['expected_forwards']}")
    print(f"{cell['msgs_per_s']:>9,} msgs/s {cell['deliveries_per_s']:>10,} deliveries/s; "
          f"CPU us/msg per node {cpu}; other load {cell['other_cpu']:.2f}; {counts}",
          flush=True)
    return cell


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}{unit}" if abs(value) >= 100 else f"{value:,.1f}{unit}"


def _cell_value(summary: dict[str, Any], key: str, field: str) -> float | None:
    cell = summary.get(key)
    return cell.get(field) if cell else None


ROWS: tuple[tuple[str, str, str, str], ...] = (
    # label, placement (or "" for a derived figure), field, target
    ("QoS 1 1->1, same node (msgs/s)", "same", "msgs_per_s", ""),
    ("QoS 1 1->1, cross-node (msgs/s)", "cross", "msgs_per_s", ""),
    ("cross/same (median of pairs)", "", "cross_over_same", f">= {CROSS_TARGET}x"),
    ("CPU us/msg per node, same node", "same", "cpu_us_per_msg", ""),
    ("CPU us/msg per node, cross-node", "cross", "cpu_us_per_msg", ""),
    ("QoS 1 1->2, local + remote (msgs/s)", "both", "msgs_per_s", ""),
    ("forwarding, publisher's node (us/msg)", "", "forward_us", ""),
    ("hop, all nodes (us/msg)", "", "hop_us", ""),
    (f"QoS 0 fan-out 1->{FANOUT} (deliveries/s)", "fanout", "deliveries_per_s", ""),
    ("fan-out CPU us/msg per node", "fanout", "cpu_us_per_msg", ""),
    ("fan-out CPU us/delivery, all nodes", "fanout", "cluster_cpu_us_per_delivery", ""),
)


def _text(summary: dict[str, Any], key: str, field: str) -> str:
    value = summary.get(field) if not key else _cell_value(summary, key, field)
    if isinstance(value, list):
        return "/".join(_num(v) for v in value)
    text = _num(value) if field != "cross_over_same" or value is None else f"{value:.2f}x"
    if key and summary.get(key) and not summary[key].get("verified"):
        text += " *"
    return text


def ratio(ours: dict[str, Any], peer: dict[str, Any], key: str, field: str) -> float | None:
    """ours / peer; none for per-node lists, and none unless both are positive: a derived
    CPU difference at or below zero is a cost too small to see, and no base for a ratio."""
    a = ours.get(field) if not key else _cell_value(ours, key, field)
    b = peer.get(field) if not key else _cell_value(peer, key, field)
    if not isinstance(a, int | float) or not isinstance(b, int | float) or min(a, b) <= 0:
        return None
    return round(a / b, 3)


def comparisons(results: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """(ours, rabbitmq) configurations of the same size, to put side by side."""
    return [(f"ours{r['nodes']}", config) for config, r in results.items()
            if r["broker"] == "rabbitmq" and f"ours{r['nodes']}" in results]


def growth(results: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """How ours' forwarding figures change from its smallest to its largest cluster."""
    sizes = sorted(r["nodes"] for r in results.values() if r["broker"] == "ours")
    if len(sizes) < 2:
        return {}
    small, large = results[f"ours{sizes[0]}"], results[f"ours{sizes[-1]}"]
    label = f"{sizes[-1]}_over_{sizes[0]}_nodes"
    return {f"{field}_{label}": ratio(large, small, key, field)
            for key, field in (("", "forward_us"), ("", "hop_us"),
                               ("fanout", "cluster_cpu_us_per_delivery"),
                               ("cross", "msgs_per_s"))}


def table(results: dict[str, dict[str, Any]]) -> str:
    configs = list(results)
    pairs = comparisons(results)
    header = ["measure", *(f"{results[c]['broker']} x{results[c]['nodes']}" for c in configs),
              *(f"{a}/{b}" for a, b in pairs), "target"]
    rows = [header]
    for label, key, field, target in ROWS:
        row = [label, *(_text(results[c], key, field) for c in configs)]
        for a, b in pairs:
            r = ratio(results[a], results[b], key, field)
            row.append("-" if r is None else f"{r:.2f}x")
        rows.append([*row, target])
    lines = report.align(rows)
    lines += ["", "per node: node 1 is the publisher's, node 2 the cross-node subscriber's; "
              "us/msg: CPU time per message through the cluster (lower is better, and so is a "
              "ratio below 1.00x on those rows)"]
    if grown := growth(results):
        lines.append("ours, largest over smallest cluster: " + ", ".join(
            f"{k} {'-' if v is None else f'{v:.2f}x'}" for k, v in grown.items()))
    for config, summary in results.items():
        if summary.get("errors"):
            lines += [f"FAILED {config}: {e.splitlines()[0][:200]}" for e in summary["errors"]]
        if summary.get("unverified_rounds"):
            lines.append(f"* {config}: counts did not add up in {summary['unverified_rounds']} "
                         "round(s) (`rounds` in the JSON: lost, duplicates, unacked_by_broker, "
                         "forwarded)")
        if summary.get("noisy_rounds"):
            lines.append(f"warning: {config}: in {summary['noisy_rounds']} round(s) other "
                         f"processes kept more than {report.BUSY_MACHINE} CPUs busy; rerun on "
                         "a quiet machine")
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    sizes = [int(n) for n in text.split(",") if n.strip()]
    if any(n < 2 for n in sizes):
        raise SystemExit("a cluster needs at least 2 nodes")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="3,5", help="cluster sizes for ours (3,5)")
    parser.add_argument("--rabbitmq-nodes", default="3", help="cluster sizes for RabbitMQ (3)")
    parser.add_argument("--duration", type=float, help="measured window per round (5 s)")
    parser.add_argument("--warmup", type=float, help="unmeasured ramp-up per round (2 s)")
    parser.add_argument("--pairs", type=int, help=f"rounds of same/cross/both ({PAIRS})")
    parser.add_argument("--quick", action="store_true",
                        help="0.5 s warm-up, 1 s windows, one round each: a smoke run")
    brokers.add_arguments(parser, ALL_BROKERS, RESULTS, pinning=False)
    args = parser.parse_args(argv)
    names = brokers.chosen(args, ALL_BROKERS)
    timing = Timing(warmup=args.warmup if args.warmup is not None else
                    (0.5 if args.quick else 2.0),
                    duration=args.duration or (1.0 if args.quick else 5.0), idle_connections=0)
    pairs = args.pairs or (1 if args.quick else PAIRS)
    sizes = {"ours": _sizes(args.nodes), "rabbitmq": _sizes(args.rabbitmq_nodes)}
    versions = {b: brokers.version(b) for b in names}
    print(f"brokers: {versions}; window {timing.duration}s after {timing.warmup}s warm-up, "
          f"{pairs} round(s) each; no CPU pinning; load average {os.getloadavg()[0]:.2f}")
    env = report.environment(versions, timing, brokers.load_cpus())
    env.pop("idle_connections")
    env.update({"cluster_sizes": {b: sizes[b] for b in names}, "pairs": pairs,
                "publisher_window": WINDOW, "qos1_max_lag": QOS1_MAX_LAG,
                "fanout_subscribers": FANOUT, "fanout_max_lag": FANOUT_MAX_LAG})
    started = time.monotonic()
    results = {f"{name}{n}": run_cluster(name, n, timing, pairs)
               for name in names for n in sizes[name]}
    env["loadavg_at_end"] = os.getloadavg()[0]
    env["total_runtime_s"] = round(time.monotonic() - started, 1)
    ratios = {f"{a}/{b}": {f"{key}.{field}" if key else field:
                           ratio(results[a], results[b], key, field)
                           for _, key, field, _ in ROWS}
              for a, b in comparisons(results)}
    report.write_json({"environment": env, "results": results, "ratios": ratios,
                       "growth": growth(results)}, args.output)
    print("\n" + table(results))
    print(f"\nwrote {args.output} in {env['total_runtime_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
