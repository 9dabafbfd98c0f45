"""The nemesis: faults on the real processes of a `cluster` fixture, and the faults a test or
a long run picks from.

`Nemesis` does the work on named nodes (kill -9, restart on the same or a wiped data dir,
SIGSTOP / SIGCONT, partitions through `FrontDoors`), keeps the clients' `Directory` honest
(a killed node is taken out at once; a restarted one is put back once every node sees it
running and it has the routes to the subscribers' nodes, as a load balancer would wait for
readiness) and labels the history with Nemesis events.

A `Fault` is one scenario, injected then healed:

    fault = KillNode("n3")
    fault.inject(nemesis); workload.run_for(3); fault.heal(nemesis)

`REPLICATED_ONLY` faults break the checker's rules until Durable Storage is replicated
(issue 18): today a durable session, and the messages stored for it, live on one node.
`pick_fault()` chooses one at random for a long run, among the nodes that hold no durable
session for the faults that need that.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tests.cluster.conftest import Cluster, Node, http_json
from tests.cluster.jepsen.history import Nemesis as NemesisEvent
from tests.cluster.jepsen.proxy import FrontDoors
from tests.cluster.jepsen.workload import Directory, Recorder, Workload
from tests.integration.clients import wait_until


class Nemesis:
    def __init__(self, cluster: Cluster, directory: Directory,
                 recorder: Recorder | None = None, doors: FrontDoors | None = None,
                 homes: Callable[[], Iterable[str]] = tuple,
                 replicated: bool = False) -> None:
        self.cluster = cluster
        self.directory = directory
        self.recorders = [recorder] if recorder is not None else []  # each labelled
        self.doors = doors
        # Where the durable sessions live (with builtin_local: their routes must be known)
        # and how many subscribed (with builtin_raft: every node stores for each of them).
        self.homes = homes
        self.subscribers: Callable[[], int] = lambda: 0
        self.replicated = replicated  # durable_storage.messages.backend = builtin_raft
        self.raft_groups = 0  # with builtin_raft: metadata + sessions + the messages shards
        self.paused: set[str] = set()
        self.down: set[str] = set()

    @property
    def names(self) -> list[str]:
        return [node.name for node in self.cluster.nodes]

    def node(self, name: str) -> Node:
        return next(node for node in self.cluster.nodes if node.name == name)

    def label(self, op: str, detail: str = "") -> None:
        for recorder in self.recorders:
            recorder.record(NemesisEvent(op, detail))

    def publish_all(self) -> None:
        """Every running node into the directory (at the start)."""
        for node in self.cluster.nodes:
            if node.name not in self.down:
                self.directory.set(node.name, node.process.tcp)

    # ---- processes ------------------------------------------------------------------------------
    def kill(self, *names: str, wipe: bool = False) -> None:
        """kill -9 of every named node at once (signals first, then the waits); with `wipe`
        their data dirs are deleted."""
        self.label("kill" + ("+wipe" if wipe else ""), ",".join(names))
        nodes = [self.node(name) for name in names]
        for node in nodes:
            self.directory.remove(node.name)
            proc = node.process.proc
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                if node.name in self.paused:
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped process dies on SIGCONT
        for node in nodes:
            node.process.kill()  # reaps it
            self.paused.discard(node.name)
            self.down.add(node.name)
            if wipe:
                shutil.rmtree(node.process.data_dir, ignore_errors=True)

    def stop(self, name: str) -> int:
        """SIGTERM, as Kubernetes or systemd stop a node for an upgrade: out of the directory
        first (a load balancer stops sending it clients), then the graceful stop; returns
        the exit code."""
        self.label("stop", name)
        node = self.node(name)
        self.directory.remove(name)
        code = node.process.stop(timeout=60)
        self.down.add(name)
        return code

    def restart(self, *names: str, timeout: float = 30.0) -> None:
        """Starts the named nodes again (in parallel, on their data dirs), waits until every
        running node sees every other running, then lets clients in."""
        self.label("restart", ",".join(names))
        errors: list[BaseException] = []

        def start(node: Node) -> None:
            try:
                node.start()
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=start, args=(self.node(name),)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        self.down.difference_update(names)
        self.wait_healthy(timeout)
        for name in names:
            self.directory.set(name, self.node(name).process.tcp)

    def pause(self, *names: str) -> None:
        """SIGSTOP: the process is frozen; its sockets stay open, the kernel still accepts
        connections on them."""
        self.label("pause", ",".join(names))
        for name in names:
            os.kill(self.node(name).pid, signal.SIGSTOP)
            self.paused.add(name)

    def resume(self, *names: str, timeout: float = 30.0) -> None:
        self.label("resume", ",".join(names))
        for name in names:
            os.kill(self.node(name).pid, signal.SIGCONT)
            self.paused.discard(name)
        self.wait_healthy(timeout)

    # ---- the network ----------------------------------------------------------------------------
    def partition(self, *groups: Iterable[str]) -> None:
        assert self.doors is not None, "partitions need the nodes wired through FrontDoors"
        sides = [sorted(group) for group in groups]
        self.label("partition", " | ".join(",".join(side) for side in sides))
        self.doors.partition(*sides)

    def cut(self, a: str, b: str) -> None:
        assert self.doors is not None, "partitions need the nodes wired through FrontDoors"
        self.label("cut", f"{a}-{b}")
        self.doors.cut(a, b)

    def heal(self, timeout: float = 30.0) -> None:
        assert self.doors is not None
        self.label("heal")
        self.doors.heal()
        self.wait_healthy(timeout)

    # ---- health ---------------------------------------------------------------------------------
    def running(self) -> list[Node]:
        return [node for node in self.cluster.nodes if node.name not in self.down]

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Every running node sees every other one running (by node name: a wiped node comes
        back as a new site with the old name), and knows where to store or send what the
        durable sessions want: with builtin_local, the routes of the nodes that hold them;
        with builtin_raft, their subscriptions from its replica of the sessions database."""
        nodes = self.running()

        def linked() -> bool:
            for node in nodes:
                seen: dict[str, set[str]] = {}
                for entry in http_json(node.http, "/api/v5/cluster")["nodes"]:
                    seen.setdefault(entry["node"], set()).add(entry["node_status"])
                if any("running" not in seen.get(other.node_name, set()) for other in nodes):
                    return False
            return True

        wait_until(linked, timeout, f"nodes {[n.name for n in nodes]} linked")
        if self.replicated:
            def led(node: Node) -> bool:
                groups = http_json(node.http, "/api/v5/raft")["groups"]
                return (len(groups) >= self.raft_groups and
                        all(group["leader"] is not None for group in groups))

            for node in nodes:
                wait_until(lambda node=node: led(node), timeout,
                           f"{node.name}: {self.raft_groups} Raft groups with leaders")
            # Durable shared groups are joined from cluster version 1, which a wiped node
            # learns from the log, and a cluster of this tree rises to once every node runs
            # it (not while one runs an earlier release: tests/support/releases.py).
            if all(node.process.code is None for node in nodes):
                self.cluster.wait_version(nodes, timeout=timeout)
            subscribers = self.subscribers()
            for node in nodes:
                wait_until(lambda node=node: node.metric("mqtt_durable_filters") >= subscribers,
                           timeout, f"{node.name} storing for {subscribers} durable sessions")
            return
        homes = set(self.homes())
        for node in nodes:
            expected = len(homes - {node.name})
            wait_until(lambda node=node, expected=expected:
                       node.metric("mqtt_cluster_routes") >= expected, timeout,
                       f"{node.name} routing to {sorted(homes)}")


# ---- faults -----------------------------------------------------------------------------------
@dataclass
class Fault:
    """One scenario: `inject`, let the workload run, `heal`."""

    kind: str
    targets: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.kind}({','.join(self.targets)})" if self.targets else self.kind

    def inject(self, nemesis: Nemesis) -> None:
        raise NotImplementedError

    def heal(self, nemesis: Nemesis) -> None:
        raise NotImplementedError


class KillNode(Fault):
    def __init__(self, *targets: str, kind: str = "kill") -> None:
        super().__init__(kind, list(targets))

    def inject(self, nemesis: Nemesis) -> None:
        nemesis.kill(*self.targets)

    def heal(self, nemesis: Nemesis) -> None:
        nemesis.restart(*self.targets)


class KillAll(KillNode):
    def __init__(self, targets: Iterable[str]) -> None:
        super().__init__(*targets, kind="kill-all")

    @property
    def name(self) -> str:
        return self.kind


class WipeNode(KillNode):
    """kill -9, the data dir deleted (a lost volume), started again empty."""

    def __init__(self, target: str) -> None:
        super().__init__(target, kind="wipe")

    def inject(self, nemesis: Nemesis) -> None:
        nemesis.kill(*self.targets, wipe=True)


class Pause(Fault):
    def __init__(self, *targets: str, kind: str = "pause") -> None:
        super().__init__(kind, list(targets))

    def inject(self, nemesis: Nemesis) -> None:
        nemesis.pause(*self.targets)

    def heal(self, nemesis: Nemesis) -> None:
        nemesis.resume(*self.targets)


class Partition(Fault):
    """`groups` talk only inside themselves; or, with `pairs`, only those links are cut (a
    bridge: n1 and n2 cut apart, n3 still sees both)."""

    def __init__(self, groups: list[list[str]] | None = None,
                 pairs: list[tuple[str, str]] | None = None, kind: str = "partition") -> None:
        super().__init__(kind, [",".join(g) for g in groups or []] or
                         [f"{a}-{b}" for a, b in pairs or []])
        self.groups = groups or []
        self.pairs = pairs or []

    @property
    def name(self) -> str:
        return f"{self.kind}({' | '.join(self.targets)})"

    def inject(self, nemesis: Nemesis) -> None:
        if self.groups:
            nemesis.partition(*self.groups)
        for a, b in self.pairs:
            nemesis.cut(a, b)

    def heal(self, nemesis: Nemesis) -> None:
        nemesis.heal()


TODAY = ("kill", "pause", "pause-majority")
"""Faults builtin_local survives, on nodes that hold no durable session (pause-majority
needs every session on one node)."""
REPLICATED_ONLY = ("kill-all", "kill-home", "wipe-home", "pause-home", "isolate", "bridge")
"""Faults that need replicated Durable Storage: a session's node lost, a minority that must
not acknowledge (the partitions need the nodes wired through FrontDoors), and every node
killed at once: with builtin_local a node that does not hold the session acknowledges a
message once it has forwarded it, so killing every node in the next millisecond or so can
lose it (tools/chaos.py found this in about 1 kill-all in 15)."""


def pick_fault(kind: str, names: list[str], homes: Iterable[str],
               rng: random.Random) -> Fault | None:
    """A fault of `kind` on random nodes of `names`; None when the kind does not fit (e.g.
    no node without a session)."""
    homes = set(homes)
    others = [name for name in names if name not in homes]
    holders = sorted(homes & set(names))
    majority = len(names) // 2 + 1
    if kind == "kill":
        return KillNode(rng.choice(others)) if others else None
    if kind == "kill-all":
        return KillAll(names)
    if kind == "pause":
        return Pause(rng.choice(others)) if others else None
    if kind == "pause-majority":
        if len(others) < majority:
            return None
        return Pause(*sorted(rng.sample(others, majority)), kind="pause-majority")
    if kind == "kill-home":
        return KillNode(rng.choice(holders), kind="kill-home") if holders else None
    if kind == "wipe-home":
        return WipeNode(rng.choice(holders)) if holders else None
    if kind == "pause-home":
        return Pause(rng.choice(holders), kind="pause-home") if holders else None
    if kind == "isolate":
        alone = rng.choice(names)
        return Partition([[alone], [n for n in names if n != alone]], kind="isolate")
    if kind == "bridge":
        a, b = sorted(rng.sample(names, 2))
        return Partition(pairs=[(a, b)], kind="bridge")
    raise ValueError(f"unknown fault kind {kind!r}")


def run_fault(workload: Workload, nemesis: Nemesis, fault: Fault | None, *,
              before: float = 2.0, during: float = 4.0, after: float = 2.0) -> None:
    """The workload running `before` seconds, then `fault` for `during` seconds (inject ..
    heal; no fault: just running), then `after` seconds more. The workload must be
    started."""
    workload.run_for(before)
    if fault is None:
        workload.run_for(during)
    else:
        fault.inject(nemesis)
        try:
            workload.run_for(during)
        finally:
            fault.heal(nemesis)
    workload.run_for(after)
