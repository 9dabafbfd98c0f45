"""Replicated Durable Storage benchmark (issue 18): ours as 3 nodes with `builtin_raft` and
replication factor 3 against ours as one node (`builtin_local`), and RabbitMQ 3.10 as 3 nodes
and as one, both with `mqtt.durable_queue_type = quorum` (a persistent session's queue is a
Raft-replicated quorum queue); every node a process on this machine, all on loopback.

    .venv/bin/python bench/replication_bench.py [--quick] [--brokers ours,rabbitmq]
                                                [--runs N] [--rounds N] [--duration S]
                                                [--failovers N] [--catch-up-messages N]

Each run (see bench/README.md, "Replicated Durable Storage benchmark"), per configuration one
fresh cluster whose clients all connect to its first node:
  1to1:     durable QoS 1, 1 -> 1: the subscriber holds a persistent session (clean
            session 0); ours RF 3: the publisher's client ID is one whose shard that node leads;
  100to1:   durable QoS 1, 100 -> 1 (one topic each, a wildcard subscription): ours'
            publishers fall on every shard, so on leaders on every node;
  `--rounds` of each in turn, the figure the median round. While a round's window runs, a
  probe publishes one QoS 1 message at a time (every PROBE_INTERVAL) to a topic an offline
  persistent session holds: its PUBLISH -> PUBACK times are the latency percentiles. Ours
  also reports, per node, Raft log entries per write-ahead-log fsync in the window.
Then, on the 3-node clusters:
  failover: kill -9 of the node leading what a probe on another node publishes to (ours: the
            shard of its client ID; RabbitMQ: its subscriber's quorum queue); the time from
            the kill to the first PUBACK of a PUBLISH sent after it; the node is restarted
            and the next round kills another leader;
and on ours RF 3 only:
  catch-up: on a fresh cluster, N messages stored, one node killed, its data dir wiped and
            the node started again: the time until its replica has applied every entry
            committed before (new site, joined as a learner), against `cp -r` of a surviving
            node's data dir; then a session drained from the new replica checks its content.
            Once with the log kept (`log`), once with it compacted every SNAPSHOT_INTERVAL
            entries, so the new replica is sent snapshots (`snapshot`), and twice with most
            data in sealed generations, shipped as files: the snapshot throttle off
            (`files`) and at its default (`files-throttled`).
Writes bench/replication_results.json (every run).
"""

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, cluster_bench, durable_bench, procstat, report, wire
from bench.brokers import Running
from bench.cluster_bench import Placement, median_round, metrics
from bench.scenarios import PAYLOAD, Timing
from broker.ds.db import shard_of
from broker.mqtt.packets import Puback

RESULTS = Path(__file__).resolve().parent / "replication_results.json"
ALL_BROKERS = ("ours", "rabbitmq")
N_SHARDS = 16
REPLICATED = {"durable_storage.messages.backend": "builtin_raft",
              "durable_storage.n_sites": "3",
              "durable_storage.messages.replication_factor": "3",
              "durable_storage.messages.n_shards": str(N_SHARDS)}
"""n_sites: the three nodes start together and must create one metadata group, not three."""
QUORUM = {"mqtt.durable_queue_type": "quorum"}
SNAPSHOT_INTERVAL = 16
"""Entries between two log truncations in the `snapshot` catch-up: with a publisher window of
500 a shard's log holds ~N/500 entries, far below the default 4096."""
TARGET = 0.5  # ours RF 3 / ours one node, msgs/s (issue 18)
PROBE_INTERVAL = 0.01
"""At most 100 probe messages/s: under 2% of the slowest configuration's load."""
FAILOVER_PROBE_INTERVAL = 0.001
"""The failover probe runs on an idle cluster, so it may publish close to back-to-back: the
failover time is known to about this plus one round trip."""
FAILOVER_LIMIT = 60.0
SETTLE_TIMEOUT = 60.0
POLL = 0.05
PARTS = ("throughput", "failover", "catch-up")


class Config(NamedTuple):
    key: str
    title: str
    broker: str
    nodes: int
    settings: dict[str, str]


def replicated(config: Config) -> bool:
    """Ours with Raft groups, whose leaders the bench looks up."""
    return config.settings is REPLICATED


CONFIGS = (Config("ours1", "ours x1 builtin_local", "ours", 1, {}),
           Config("ours3", "ours x3 builtin_raft RF 3", "ours", 3, REPLICATED),
           Config("rabbitmq1", "rabbitmq x1 quorum queues", "rabbitmq", 1, QUORUM),
           Config("rabbitmq3", "rabbitmq x3 quorum queues", "rabbitmq", 3, QUORUM))
PLACEMENTS = (
    Placement("1to1", "durable QoS 1, 1 -> 1", 1, (0,), clean=False),
    Placement("100to1", "durable QoS 1, 100 -> 1", 1, (0,), publishers=100, window=5,
              clean=False),
)
"""100 -> 1: 5 in flight per publisher, 500 in all, as the 1 -> 1 publisher's window."""
RATIOS = (("ours3", "ours1", f">= {TARGET}x"), ("rabbitmq3", "rabbitmq1", ""),
          ("ours3", "rabbitmq3", ""), ("ours1", "rabbitmq1", ""))


# ---- ours' Raft groups, from GET /api/v5/raft ----------------------------------------------

def raft_status(member: Running) -> dict[str, Any]:
    return brokers.http_json(member.http_port, "/api/v5/raft")


def shard_leaders(member: Running) -> dict[int, str | None]:
    """Shard -> leader site, as this node sees it."""
    return {int(g["name"].rsplit(" ", 1)[1]): g["leader"] for g in raft_status(member)["groups"]
            if g["name"].startswith("messages shard ")}


def wait_led(members: list[Running], groups: int = 2 + N_SHARDS) -> None:
    """Every node hosts every group (metadata, sessions, the shards) and sees its leader."""
    def led(member: Running) -> bool:
        try:
            found = raft_status(member)["groups"]
        except OSError:
            return False
        return len(found) >= groups and all(g["leader"] for g in found)

    wait_for(lambda: all(led(m) for m in members), members, "Raft groups with leaders")


def wait_for(done: Callable[[], bool], members: list[Running], what: str,
             timeout: float = SETTLE_TIMEOUT) -> float:
    """Poll every POLL s until `done()`; when it was seen (monotonic). Fails when a node
    died or after `timeout`."""
    deadline = time.monotonic() + timeout
    while not done():
        if dead := [m for m in members if not m.alive()]:
            raise RuntimeError(f"{dead[0].node} died while waiting for {what}:\n"
                               f"{dead[0].log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f}s")
        time.sleep(POLL)
    return time.monotonic()


def driving_first(members: list[Running]) -> list[Running]:
    """The members with the one the round drives from first: node 1, unless elections left
    it leading no shard (then no publisher there could write to its own log), in which case
    the first node that leads one. Every node hosts every shard, so the rounds are alike
    from any of them; what each node saw is printed to tell a quirk of elections from a
    node missing from the groups."""
    if members[0].name != "ours" or len(members) == 1:
        return members
    seen = [(m, raft_status(m)["site"], shard_leaders(m)) for m in members]
    leading = [m for m, site, leaders in seen if site in leaders.values()]
    if members[0] in leading:
        return members
    print(f"  {members[0].node} leads no shard; groups led per site, as each node sees them: "
          + "; ".join(f"{m.node} ({site}): {dict(Counter(map(str, leaders.values())))}"
                      for m, site, leaders in seen), flush=True)
    if not leading:
        raise RuntimeError("no node leads a shard of its own site")
    return [leading[0], *(m for m in members if m is not leading[0])]


def client_led_by(members: list[Running], node: Running, candidates: Iterable[str]) -> str:
    """The first candidate client ID whose shard `node` leads: a publisher connected there
    writes to its own log, as on one node (the first candidate where nothing is led)."""
    options = list(candidates)
    if members[0].name != "ours" or len(members) == 1:
        return options[0]
    me, leaders = raft_status(node)["site"], shard_leaders(node)
    led = next((c for c in options if leaders.get(shard_of(c, N_SHARDS)) == me), None)
    if led is None:  # elections placed every leader elsewhere: the round would not measure
        raise RuntimeError(f"{node.node} leads no shard of {len(options)} candidate client "
                           f"IDs (leaders: {sorted(set(map(str, leaders.values())))})")
    return led


# ---- the PUBACK probe --------------------------------------------------------------------

def durable_subscription(port: int, client_id: str, topic: str) -> None:
    """A persistent session (3.1.1, clean session 0) with a QoS 1 subscription, left offline:
    what it subscribes to is stored durably (ours) or queued in its quorum queue (RabbitMQ),
    so a PUBACK for it waits for that write."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(wire.connect(client_id, clean=False))
        wire.recv_exact(sock, wire.CONNACK_SIZE)
        sock.sendall(wire.subscribe(topic, 1))
        granted = getattr(wire.decode_one(wire.recv_exact(sock, wire.SUBACK_SIZE)),
                          "reason_codes", None)
        if granted != [1]:
            raise ConnectionError(f"{client_id}: SUBACK granted {granted}")
        sock.sendall(wire.DISCONNECT)


class Probe:
    """One QoS 1 publisher in a thread of the orchestrator, one PUBLISH in flight, the next
    `interval` after the previous was sent (at once if its PUBACK took longer): (sent,
    acknowledged) times of those sent while `recording`. A thread, not a load worker: it
    sends too little to need a core of its own, and its times are read in this process."""

    def __init__(self, port: int, client_id: str, topic: str, interval: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=FAILOVER_LIMIT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(wire.connect(client_id))
        wire.recv_exact(self.sock, wire.CONNACK_SIZE)
        self.packets = [wire.publish(topic, PAYLOAD, 1, i) for i in range(1, 1025)]
        self.interval = interval
        self.recording = False
        self.samples: list[tuple[float, float]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Probe":
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(FAILOVER_LIMIT + 5)
        self.sock.close()

    def _run(self) -> None:
        try:
            n = 0
            while not self._stop.is_set():
                sent = time.monotonic()
                self.sock.sendall(self.packets[n % len(self.packets)])
                reply = wire.decode_one(wire.recv_exact(self.sock, 4))
                acked = time.monotonic()
                if not isinstance(reply, Puback) or reply.packet_id != n % 1024 + 1:
                    raise ConnectionError(f"expected PUBACK {n % 1024 + 1}, got {reply}")
                if self.recording:
                    self.samples.append((sent, acked))
                n += 1
                self._stop.wait(self.interval - (acked - sent))
        except BaseException as exc:  # reported by `check`, in the orchestrator
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"probe failed: {type(self.error).__name__}: {self.error}")

    def first_ack_after(self, moment: float) -> float | None:
        """When the first PUBLISH sent at or after `moment` was acknowledged."""
        return next((acked for sent, acked in list(self.samples) if sent >= moment), None)


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: a value that was measured."""
    ranked = sorted(values)
    return ranked[max(1, math.ceil(len(ranked) * q / 100)) - 1]


class Window:
    """What a round records in its measured window besides cluster_bench.measure's figures:
    the probe's PUBACK times and, for ours, each node's write-ahead-log and storage counters
    (`cluster_bench.measure` enters it for the window alone)."""

    COUNTERS = ("raft_wal_fsyncs_total", "raft_wal_entries_per_fsync", "ds_batches_total",
                "ds_messages_total")

    def __init__(self, probe: Probe, members: list[Running]) -> None:
        self.probe = probe
        self.members = members if members[0].name == "ours" else []
        self.before: list[dict[str, float]] = []
        self.after: list[dict[str, float]] = []

    def __enter__(self) -> None:
        self.before = [metrics(m, *self.COUNTERS) for m in self.members]
        self.probe.recording = True

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.probe.recording = False
        self.after = [metrics(m, *self.COUNTERS) for m in self.members]

    def figures(self, window_s: float) -> dict[str, Any]:
        self.probe.check()
        rtts = [(acked - sent) * 1000 for sent, acked in self.probe.samples]
        out: dict[str, Any] = {
            "puback_samples": len(rtts),
            **({f"puback_{name}_ms": round(percentile(rtts, q), 2)
                for name, q in (("p50", 50), ("p99", 99), ("max", 100))} if rtts else {}),
        }
        if self.members:
            # The WAL exports its average since start: entries = average x fsyncs.
            entries, fsyncs, per_batch = [], [], []
            for a, b in zip(self.before, self.after, strict=True):
                syncs = b["raft_wal_fsyncs_total"] - a["raft_wal_fsyncs_total"]
                written = (b["raft_wal_entries_per_fsync"] * b["raft_wal_fsyncs_total"]
                           - a["raft_wal_entries_per_fsync"] * a["raft_wal_fsyncs_total"])
                batches = b["ds_batches_total"] - a["ds_batches_total"]
                entries.append(round(written / syncs, 2) if syncs else None)
                fsyncs.append(round(syncs / window_s))
                per_batch.append(round((b["ds_messages_total"] - a["ds_messages_total"])
                                       / batches, 1) if batches else None)
            out.update({"wal_entries_per_fsync": entries, "wal_fsyncs_per_s": fsyncs,
                        "ds_messages_per_batch": per_batch})
        return out


# ---- throughput rounds -------------------------------------------------------------------

def throughput_round(pl: Placement, members: list[Running], timing: Timing,
                     label: str) -> dict[str, Any]:
    members = driving_first(members)
    node = members[0]
    probes = (f"bench-probe-{label}-{i}" for i in range(200))
    if pl.publishers == 1:  # ours RF 3: a publisher on its shard leader's node (see above)
        labels = {cluster_bench.publisher_ids(f"{label}{s}", 1)[0]: f"{label}{s}"
                  for s in ("", *"bcdefghijklmnopq", *range(200))}
        publisher = client_led_by(members, node, labels)
        label = labels[publisher]
        # The probe's messages would be a second stream in the publisher's shard: LevelDB's
        # tables would then overlap and every compaction rewrite them (broker/ds/keys.py),
        # in some rounds and not others, as the two client IDs happen to hash.
        probes = (f"bench-probe-{label}-{i}" for i in range(200))
        probes = (c for c in probes if shard_of(c, N_SHARDS) != shard_of(publisher, N_SHARDS))
    probe_id = client_led_by(members, node, probes)
    topic = f"bench/probe/{label}"
    durable_subscription(node.port, f"bench-probe-{label}-sub", topic)
    with Probe(node.port, probe_id, topic, PROBE_INTERVAL) as probe:
        window = Window(probe, members)
        cell = cluster_bench.run_round(pl, members, timing, label, window)
    if "error" in cell:
        return cell
    cell.update(window.figures(cell["window_s"]))
    if len(members) > 1 and node.name == "ours":
        # A durable session's state (acknowledgements, stream positions) is written through
        # the `sessions` group: kept to compare rounds whose leader was here or elsewhere.
        status = raft_status(node)
        cell["sessions_leader_on_node1"] = any(
            g["name"] == "sessions" and g["leader"] == status["site"] for g in status["groups"])
        if pl.publishers == 1:  # still so at the end of the round
            shard = shard_of(cluster_bench.publisher_ids(label, 1)[0], N_SHARDS)
            cell["publisher_shard_led_on_node1"] = (
                shard_leaders(node).get(shard) == status["site"])
    print(f"  {'':<22} PUBACK p50 {cell.get('puback_p50_ms')} ms, p99 "
          f"{cell.get('puback_p99_ms')} ms ({cell['puback_samples']} probes)"
          + (f"; WAL entries/fsync per node {cell['wal_entries_per_fsync']}"
             if "wal_entries_per_fsync" in cell else ""), flush=True)
    return cell


def run_config(config: Config, timing: Timing, rounds: int,
               failovers: int) -> dict[str, Any]:
    """A fresh cluster: the placements in turn `rounds` times, then (ours RF 3) the
    failover rounds on the same cluster; a round that fails is recorded and the others go on
    (a cluster that fails to start, or a node that dies, fails what is left)."""
    out: dict[str, Any] = {"config": config.title, "broker": config.broker,
                           "nodes": config.nodes, "settings": config.settings}
    cells: dict[str, list[dict[str, Any]]] = {pl.key: [] for pl in PLACEMENTS}
    started = time.monotonic()
    try:
        with brokers.running_cluster(config.broker, config.nodes, config.settings) as members:
            if replicated(config):
                wait_led(members)
            print(f"{config.title}: up in {time.monotonic() - started:.1f}s "
                  f"(pids {[m.pid for m in members]})", flush=True)
            for n in range(rounds):
                for pl in PLACEMENTS:
                    cells[pl.key].append(throughput_round(
                        pl, members, timing, f"{config.key}-{pl.key}-{n + 1}"))
            if config.broker == "rabbitmq":  # evidence that the sessions' queues are quorum
                listing = json.loads(brokers.rabbitmqctl(
                    members[0], "-q", "list_queues", "name", "type", "--formatter", "json"))
                out["queue_types"] = sorted({q["type"] for q in listing})
            if config.nodes > 1 and failovers:
                out["failover"] = failover(members, failovers)
    except Exception as exc:
        failed = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{config.title}: FAILED {failed['error'][:300]}", flush=True)
        for done in cells.values():
            done += [failed] * (rounds - len(done))
    out.update(collect(cells))
    out["runtime_s"] = round(time.monotonic() - started, 1)
    return out


def collect(cells: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Rounds by placement -> per placement its median round (`median_round`, whole) and
    `<placement>_rounds` (every round); the failed rounds' errors in `errors`."""
    out: dict[str, Any] = {}
    for key, done in cells.items():
        if errors := [c["error"] for c in done if "error" in c]:
            out.setdefault("errors", []).extend(errors)
        if good := [c for c in done if "error" not in c]:
            out[key] = median_round(good)
        out[f"{key}_rounds"] = done
    return out


def notes(key: str, config: dict[str, Any], placements: Iterable[str]) -> list[str]:
    """The lines under a table for one configuration (`collect`'s): its failures, and how
    many of its rounds other processes disturbed."""
    lines = [f"FAILED {key}: {error.splitlines()[0][:200]}" for error in config.get("errors", [])]
    noisy = sum(c.get("other_cpu", 0.0) > report.BUSY_MACHINE
                for placement in placements for c in config.get(f"{placement}_rounds", []))
    if noisy:
        lines.append(f"warning: {key}: in {noisy} round(s) other processes kept more than "
                     f"{report.BUSY_MACHINE} CPUs busy (shared machine)")
    return lines


# ---- failover (ours RF 3, RabbitMQ x3) ----------------------------------------------------

@dataclass(slots=True)
class Target:
    """One failover round's roles: the probe publishes to `node` as `probe_id` on `topic`,
    whose messages only `victim` leads (ours: the shard's leader; RabbitMQ: the quorum
    queue's); `leader()` names the leader as seen from `node` (after the kill: the new
    one), `settled()` waits until the cluster is whole again after the victim's restart."""

    node: Running
    victim: Running
    probe_id: str
    topic: str
    what: dict[str, Any]
    leader: Callable[[], str | None]
    settled: Callable[[], None]


def ours_target(members: list[Running], n: int) -> Target:
    """The probe on node n % 3 (or the next node, when that one leads every shard: the
    restarted victims lead nothing until a later election), its client ID one whose shard
    another node leads."""
    sites = {raft_status(m)["site"]: m for m in members}
    for k in range(len(members)):
        node = members[(n + k) % len(members)]
        me, leaders = raft_status(node)["site"], shard_leaders(node)
        probe_id = next((c for c in (f"bench-failover-{n}-{i}" for i in range(1000))
                         if leaders.get(shard_of(c, N_SHARDS)) not in (None, me)), "")
        if probe_id:
            break
    if not probe_id:
        raise RuntimeError(f"no node sees a shard led by another node: {leaders}")
    shard = shard_of(probe_id, N_SHARDS)
    topic = f"bench/failover/{n}"
    durable_subscription(node.port, f"bench-failover-{n}-sub", topic)

    def leader() -> str | None:
        site = shard_leaders(node).get(shard)
        return sites[site].node if site in sites else site

    return Target(node, sites[str(leaders[shard])], probe_id, topic, {"shard": shard},
                  leader, lambda: wait_led(members))


def rabbitmq_target(members: list[Running], n: int) -> Target:
    """The session's quorum queue declared on node n % 3 (RabbitMQ 3.10 puts a quorum
    queue's leader on the declaring node), the probe on the next node."""
    declared, node = members[n % len(members)], members[(n + 1) % len(members)]
    session, topic = f"bench-failover-{n}-sub", f"bench/failover/{n}"
    durable_subscription(declared.port, session, topic)
    queue = f"mqtt-subscription-{session}qos1"

    def leader() -> str | None:
        listing = json.loads(brokers.rabbitmqctl(node, "-q", "list_queues", "name", "leader",
                                                 "--formatter", "json"))
        return next((q["leader"] for q in listing if q["name"] == queue), None)

    victim = next(m for m in members if m.node == leader())
    if victim is node:
        raise RuntimeError(f"{queue} is led by the probe's node {node.node}")

    def settled() -> None:
        brokers.rabbitmqctl(victim, "await_online_nodes", str(len(members)))

    return Target(node, victim, f"bench-failover-{n}-pub", topic, {"queue": queue}, leader,
                  settled)


def failover(members: list[Running], kills: int) -> dict[str, Any]:
    """`kills` times `failover_once`, the probe on each node in turn; p50 and max."""
    cells = [failover_once(members, n) for n in range(kills)]
    times = [c["failover_s"] for c in cells if "failover_s" in c]
    return {"kills": cells, "failover_p50_s": percentile(times, 50) if times else None,
            "failover_max_s": max(times) if times else None}


def failover_once(members: list[Running], n: int) -> dict[str, Any]:
    """A probe publishes through one node to messages another node leads; that node is
    killed (-9): seconds from the kill to the first PUBACK of a PUBLISH sent after it. The
    node is started again on its data and the cluster settles before the next kill."""
    target = (ours_target if members[0].name == "ours" else rabbitmq_target)(members, n)
    node, victim = target.node, target.victim
    survivors = [m for m in members if m is not victim]
    print(f"  failover {n + 1}: {target.what}, kill -9 {victim.node} (probe on {node.node})",
          end=" ", flush=True)
    with Probe(node.port, target.probe_id, target.topic, FAILOVER_PROBE_INTERVAL) as probe:
        probe.recording = True
        time.sleep(1.0)  # acknowledgements flowing before the kill
        probe.check()
        if not probe.samples:
            raise RuntimeError(f"failover probe: no PUBACK in 1 s from {node.node}")
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: probe.error is not None or probe.first_ack_after(killed) is not None,
                 survivors, "a PUBACK after the kill", FAILOVER_LIMIT)
        probe.check()
        first = probe.first_ack_after(killed)
        assert first is not None
    cell = {**target.what, "killed": victim.node, "probe_node": node.node,
            "failover_s": round(first - killed, 3), "new_leader": target.leader()}
    _, restart_s = brokers.restart(victim, signal.SIGKILL)
    target.settled()
    cell["restart_to_connack_s"] = round(restart_s, 3)
    print(f"-> first PUBACK after {cell['failover_s']} s; new leader {cell['new_leader']}",
          flush=True)
    return cell


# ---- catch-up of a new replica (ours RF 3) -----------------------------------------------

SEALED_GENERATION = "16MB"
"""`generation_max_size` of the `files` catch-up: most of the data sits in sealed
generations, which a new replica gets as their files (broker/ds/shipped.py)."""
CATCH_UP_VARIANTS: tuple[tuple[str, dict[str, str]], ...] = (
    ("log", {}),
    ("snapshot", {"durable_storage.raft.snapshot_interval": str(SNAPSHOT_INTERVAL)}),
    ("files", {"durable_storage.messages.generation_max_size": SEALED_GENERATION,
               "durable_storage.raft.snapshot_bytes_rate": "0"}),
    ("files-throttled", {"durable_storage.messages.generation_max_size": SEALED_GENERATION}),
)
"""`files` measures the mechanism (the throttle off: `cp -r` has none), `files-throttled`
what the default `snapshot_bytes_rate` (256MB/s) costs on top."""


def _commits(members: list[Running]) -> dict[int, int]:
    """Group -> the highest commit index any node reports."""
    out: dict[int, int] = {}
    for member in members:
        for group in raft_status(member)["groups"]:
            out[group["id"]] = max(out.get(group["id"], 0), group["commit"])
    return out


def _answers(member: Running) -> bool:
    try:
        raft_status(member)
    except OSError:  # not listening yet
        return False
    return True


def _joined(survivors: list[Running], old: set[str]) -> bool:
    """Whether a survivor has the new site (one not in `old`) in a group's configuration:
    a group's leader added it as a learner."""
    for member in survivors:
        for group in raft_status(member)["groups"]:
            if {*group["voters"], *group["learners"]} - old:
                return True
    return False


def _applied(member: Running, target: dict[int, int]) -> bool:
    try:
        groups = {g["id"]: g["applied"] for g in raft_status(member)["groups"]}
    except OSError:  # not listening yet
        return False
    return all(groups.get(group, -1) >= index for group, index in target.items())


def _membership(member: Running, old_site: str) -> dict[str, int]:
    """In how many of the groups `member` hosts its (new) site votes, and its old site
    (the data dir that was wiped) still does, as it sees them at the end of the round."""
    status = raft_status(member)
    groups = status["groups"]
    return {"groups": len(groups),
            "new_site_voter_in": sum(status["site"] in g["voters"] for g in groups),
            "old_site_voter_in": sum(old_site in g["voters"] for g in groups)}


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def catch_up(variant: str, settings: dict[str, str], messages: int) -> dict[str, Any]:
    """A fresh 3-node cluster; one offline session, `messages` stored for it; once every
    node applied them, node 3 is killed, its data dir emptied and the node started again:
    seconds until it applied everything committed before, from its start, from its HTTP
    API's first answer (`transfer_s`: the node serves it last, once it is in the cluster, so
    the join and, on a slow start, part of the transfer come before) and from the first
    group that took it as a learner (`from_join_s`: the whole mechanism); `cp -r` of node
    2's data dir for comparison; then the session, resumed on node 3, must get every message
    from the new replica."""
    out: dict[str, Any] = {"variant": variant, "messages": messages}
    print(f"  catch-up ({variant}): {messages} messages", end=" ", flush=True)
    with brokers.running_cluster("ours", 3, {**REPLICATED, **settings}) as members:
        wait_led(members)
        durable_bench.create_sessions(members[0], 1)
        stored = durable_bench.publish(members[0], messages)
        out.update({k: stored[k] for k in ("published", "publish_msgs_per_s")})
        target = _commits(members)
        wait_for(lambda: all(_applied(m, target) for m in members), members,
                 "every node applied the messages")
        victim, source = members[2], members[1]
        old_site = raft_status(victim)["site"]
        old = {raft_status(m)["site"] for m in members}
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait()
        data = victim.tmp / "data"
        shutil.rmtree(data)
        data.mkdir()
        started = time.monotonic()
        brokers.respawn(victim)
        joined = wait_for(lambda: _joined(members[:2], old), members,
                          "the new site added to a group")
        up = wait_for(lambda: _answers(victim), members, "the emptied node's HTTP API")
        cpu = [procstat.cpu_seconds(m.pid) for m in members]
        done = wait_for(lambda: _applied(victim, target), members,
                        "the new replica caught up", 600)
        cpu = [round(procstat.cpu_seconds(m.pid) - c, 3) for m, c in zip(members, cpu,
                                                                          strict=True)]
        connack = wait_for(lambda: brokers.probe(victim.port), members, "its first CONNACK")
        copy = victim.tmp.parent / "copy"
        copy_started = time.monotonic()
        subprocess.run(["cp", "-r", str(source.tmp / "data"), str(copy)], check=True)
        copy_s = time.monotonic() - copy_started
        out.update({
            "up_s": round(up - started, 3),
            "caught_up_s": round(done - started, 3),
            "transfer_s": round(done - up, 3),
            "joined_s": round(joined - started, 3),
            "from_join_s": round(done - joined, 3),
            # CPU seconds of each node (the new replica last) over `transfer_s`
            "nodes_cpu_s": cpu,
            "first_connack_s": round(connack - started, 3),
            "catch_up_msgs_per_s": round(messages / max(done - up, POLL)),
            "source_data_mib": round(_size(source.tmp / "data") / 2**20, 1),
            "replica_data_mib": round(_size(data) / 2**20, 1),
            "copy_s": round(copy_s, 3),
            "copy_msgs_per_s": round(messages / copy_s),
            # > 0 once some group's log was compacted: the new replica got snapshots
            "snapshot_indexes": metrics(source, "raft_snapshot_index")["raft_snapshot_index"],
        })
        shutil.rmtree(copy)
        drained = durable_bench.drain(victim, 1, messages)
        out.update({"drain_" + k.removeprefix("drain_"): v for k, v in drained.items()})
        out.update(_membership(victim, old_site))
        out["catch_up_over_copy"] = round(out["catch_up_msgs_per_s"] / out["copy_msgs_per_s"], 4)
        out["from_join_over_copy"] = round(copy_s / max(done - joined, POLL), 4)
    print(f"-> {out['transfer_s']} s from its HTTP API's first answer "
          f"({out['catch_up_msgs_per_s']:,} msgs/s), {out['from_join_s']} s from its join; "
          f"cp -r {out['copy_s']} s; "
          f"drained {out['drain_delivered']} of {messages}", flush=True)
    return out


# ---- one run, the table, the command line ------------------------------------------------

def ratio(results: dict[str, dict[str, Any]], a: str, b: str, key: str,
          name: str) -> float | None:
    """a / b of one figure of two configurations' median rounds, if both have it."""
    x, y = (results.get(c, {}).get(key, {}).get(name) for c in (a, b))
    if not isinstance(x, int | float) or not isinstance(y, int | float) or y <= 0:
        return None
    return round(x / y, 3)


FIGURES = (("msgs_per_s", "msgs/s"), ("puback_p50_ms", "PUBACK p50 (ms)"),
           ("puback_p99_ms", "PUBACK p99 (ms)"))


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per pair of RATIOS, the figures of FIGURES per placement and, where both ran it,
    the failover time's p50."""
    return {f"{a}/{b}": {f"{pl.key}.{name}": ratio(results, a, b, pl.key, name)
                         for pl in PLACEMENTS for name, _ in FIGURES}
            | ({"failover_p50_s": ratio(results, a, b, "failover", "failover_p50_s")}
               if "failover" in results[a] and "failover" in results[b] else {})
            for a, b, _ in RATIOS if a in results and b in results}


def one_run(configs: list[Config], timing: Timing, rounds: int, failovers: int,
            catch_up_messages: int, variants: set[str] | None = None) -> dict[str, Any]:
    started = time.monotonic()
    results = {c.key: run_config(c, timing, rounds, failovers) for c in configs
               if rounds or (failovers and c.nodes > 1)}
    run: dict[str, Any] = {"results": results, "ratios": ratios(results)}
    if any(replicated(c) for c in configs) and catch_up_messages:
        run["catch_up"] = []
        for variant, settings in CATCH_UP_VARIANTS:
            if variants is not None and variant not in variants:
                continue
            try:
                run["catch_up"].append(catch_up(variant, settings, catch_up_messages))
            except Exception as exc:
                print(f"FAILED {type(exc).__name__}: {exc}", flush=True)
                run["catch_up"].append({"variant": variant,
                                        "error": f"{type(exc).__name__}: {exc}"})
    run["runtime_s"] = round(time.monotonic() - started, 1)
    return run


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "/".join(_text(v) for v in value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def table(run: dict[str, Any]) -> str:
    results = run["results"]
    pairs = [(a, b, target) for a, b, target in RATIOS if a in results and b in results]
    rows = [["measure", *(results[c]["config"] for c in results),
             *(f"{a}/{b}" for a, b, _ in pairs), "target"]]
    for pl in [pl for pl in PLACEMENTS if any(pl.key in c for c in results.values())]:
        for name, label in FIGURES:
            row = [f"{pl.title}: {label}"]
            for config in results.values():
                cell = config.get(pl.key)
                text = _text(cell.get(name)) if cell else "FAILED"
                row.append(text + (" *" if cell and not cell["verified"] else ""))
            for a, b, _ in pairs:
                r = ratio(results, a, b, pl.key, name)
                row.append("-" if r is None else f"{r:.2f}x")
            # the target is the first pair's (ours3/ours1), on the rate
            rows.append([*row, pairs[0][2] if pairs and name == "msgs_per_s" else ""])
        for name, label in (("wal_entries_per_fsync", "WAL entries per fsync, per node"),
                            ("ds_messages_per_batch", "messages per DS batch, per node")):
            row = [f"{pl.title}: {label}"]
            row += [_text((config.get(pl.key) or {}).get(name)) for config in results.values()]
            rows.append([*row, *([""] * len(pairs)), ""])
    lines = report.align(rows) if len(rows) > 1 else []
    if any(" *" in cell for row in rows for cell in row):
        lines.append("* counts did not add up (lost, duplicates or unacknowledged: see the JSON)")
    for key, config in results.items():
        lines += notes(key, config, [pl.key for pl in PLACEMENTS])
        if fo := config.get("failover"):
            times = [k.get("failover_s") for k in fo["kills"]]
            lines.append(f"{key} failover, kill -9 of the leader -> first PUBACK: p50 "
                         f"{_text(fo['failover_p50_s'])} s, max {_text(fo['failover_max_s'])} s"
                         f" over {len(times)} kills {times}")
    for cu in run.get("catch_up", []):
        if "error" in cu:
            lines.append(f"catch-up ({cu['variant']}): FAILED {cu['error'][:200]}")
            continue
        lines.append(
            f"catch-up ({cu['variant']}), {cu['messages']:,} messages, "
            f"{cu['source_data_mib']} MiB: new replica {cu['transfer_s']} s after its "
            f"HTTP API answered ({cu['up_s']} s to start, first CONNACK {cu['first_connack_s']}"
            f" s) = "
            f"{cu['catch_up_msgs_per_s']:,} msgs/s; cp -r {cu['copy_s']} s = "
            f"{cu['copy_msgs_per_s']:,} msgs/s; ratio {cu['catch_up_over_copy']:.3f}x; "
            + (f"from the new site's join ({cu['joined_s']} s after start) "
               f"{cu['from_join_s']} s, ratio {cu['from_join_over_copy']:.3f}x; "
               if "from_join_s" in cu else "") +
            f"CPU of the nodes meanwhile {cu.get('nodes_cpu_s')} s; "
            f"drained from it {cu['drain_delivered']:,} of {cu['messages']:,}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, help="whole measurements, one after the other (2)")
    parser.add_argument("--rounds", type=int, help="rounds of each placement per run (3)")
    parser.add_argument("--duration", type=float, help="measured window per round (5 s)")
    parser.add_argument("--warmup", type=float, help="unmeasured ramp-up per round (2 s)")
    parser.add_argument("--failovers", type=int, help="leaders killed per 3-node cluster (5)")
    parser.add_argument("--catch-up-messages", type=int,
                        help="messages a new replica catches up (300000)")
    parser.add_argument("--catch-up-variants",
                        help="comma-separated subset of: "
                        + ",".join(v for v, _ in CATCH_UP_VARIANTS) + " (all)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="comma-separated subset of: " + ",".join(PARTS))
    parser.add_argument("--quick", action="store_true",
                        help="one run, one 1 s round each, one kill, 5000 messages: a smoke run")
    brokers.add_arguments(parser, ALL_BROKERS, RESULTS, pinning=False)
    args = parser.parse_args(argv)
    names = brokers.chosen(args, ALL_BROKERS)
    quick = args.quick

    def pick(value: Any, full: Any, smoke: Any) -> Any:
        return value if value is not None else smoke if quick else full

    timing = Timing(warmup=pick(args.warmup, 2.0, 0.5), duration=pick(args.duration, 5.0, 1.0),
                    idle_connections=0)
    runs, rounds = pick(args.runs, 2, 1), pick(args.rounds, 3, 1)
    failovers = pick(args.failovers, 5, 1)
    # Joining (a new site, learner in every group) takes about a second whatever the data:
    # with much less than this the rate would mostly measure that.
    messages = pick(args.catch_up_messages, 300_000, 5_000)
    parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    if unknown := parts - set(PARTS):
        raise SystemExit(f"unknown part(s) {sorted(unknown)}; choose from {', '.join(PARTS)}")
    rounds, failovers, messages = (rounds if "throughput" in parts else 0,
                                   failovers if "failover" in parts else 0,
                                   messages if "catch-up" in parts else 0)
    variants = ({v.strip() for v in args.catch_up_variants.split(",")}
                if args.catch_up_variants else None)
    configs = [c for c in CONFIGS if c.broker in names]
    versions = {b: brokers.version(b) for b in names}
    print(f"brokers: {versions}; {runs} run(s) of {rounds} round(s), window {timing.duration}s "
          f"after {timing.warmup}s; no CPU pinning; load average {os.getloadavg()[0]:.2f}")
    env = report.environment(versions, timing, brokers.load_cpus())
    env.pop("idle_connections")
    env.update({"configs": {c.key: c.title for c in configs}, "parts": sorted(parts),
                "runs": runs, "rounds": rounds,
                "failovers": failovers, "catch_up_messages": messages,
                "probe_interval_s": PROBE_INTERVAL, "publisher_window": cluster_bench.WINDOW,
                "qos1_max_lag": cluster_bench.QOS1_MAX_LAG,
                "snapshot_interval_snapshot_variant": SNAPSHOT_INTERVAL})
    started = time.monotonic()
    done: list[dict[str, Any]] = []
    for n in range(runs):
        print(f"\nrun {n + 1} of {runs}", flush=True)
        done.append(one_run(configs, timing, rounds, failovers, messages, variants))
        report.write_json({"environment": env, "runs": done}, args.output)
    env["loadavg_at_end"] = os.getloadavg()[0]
    env["total_runtime_s"] = round(time.monotonic() - started, 1)
    report.write_json({"environment": env, "runs": done}, args.output)
    for n, run in enumerate(done):
        print(f"\nrun {n + 1}:\n{table(run)}")
    print(f"\nwrote {args.output} in {env['total_runtime_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
