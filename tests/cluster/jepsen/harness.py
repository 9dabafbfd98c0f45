"""A cluster under test: real nodes (a `cluster` fixture's `Cluster`), the clients'
directory, a recorder, a nemesis and, on request, front doors for partitions. Used by the
`jepsen` fixture (conftest.py) and by tools/chaos.py."""

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.cluster.conftest import Cluster, Node
from tests.cluster.jepsen.faults import Nemesis
from tests.cluster.jepsen.proxy import FrontDoors
from tests.cluster.jepsen.shared import SharedConfig, SharedWorkload
from tests.cluster.jepsen.workload import Directory, Recorder, Workload, WorkloadConfig

THREE = {"durable_storage.n_sites": "3"}  # as tests/cluster/test_raft_retained.py
LOCAL, RAFT = "builtin_local", "builtin_raft"  # durable_storage.messages.backend
W = TypeVar("W", bound=Workload)


def backend(name: str) -> dict[str, str]:
    """The settings of a Durable Storage backend (with builtin_raft, 4 shards: 6 Raft groups
    per node rather than 18, on a small machine)."""
    settings = {"durable_storage.messages.backend": name}
    if name == RAFT:
        settings["durable_storage.messages.n_shards"] = "4"
    return settings


def n_shards(node: Node) -> int:
    """Shards of the node's messages database."""
    return int(node.settings.get("durable_storage.messages.n_shards", "16"))


@dataclass
class Harness:
    cluster: Cluster
    nodes: list[Node]
    directory: Directory
    recorder: Recorder
    nemesis: Nemesis
    doors: FrontDoors | None = None
    workloads: list[Workload] = field(default_factory=list)

    def workload(self, **config: Any) -> Workload:
        """A workload on this cluster (not started), recording into the harness's recorder;
        its subscribers' nodes are what the nemesis waits for routes to after a restart."""
        return self._add(Workload(self.directory, self.recorder, WorkloadConfig(**config)))

    def shared_workload(self, **config: Any) -> SharedWorkload:
        """A shared-subscription workload (shared.py) on this cluster (not started), with a
        history of its own (labelled by the nemesis too): it may run next to `workload`."""
        recorder = Recorder()
        self.nemesis.recorders.append(recorder)
        config.setdefault("n_shards", n_shards(self.nodes[0]))
        return self._add(SharedWorkload(self.directory, recorder, SharedConfig(**config)))

    def _add(self, workload: W) -> W:
        self.workloads.append(workload)
        workloads = self.workloads
        self.nemesis.homes = lambda: {node for w in workloads for node in w.homes().values()}
        self.nemesis.subscribers = lambda: sum(w.durable_filters() for w in workloads)
        return workload

    def keep_evidence(self) -> Path:
        """The histories (history.jsonl, and history-<label>.jsonl of a workload with a
        recorder of its own; with wall-clock times) and every node's log (n*.log) written
        next to the nodes' data dirs; returns that directory."""
        where = self.cluster.tmp_path
        self.dump_histories(where)
        for node in self.nodes:
            (where / f"{node.name}.log").write_text(node.process.log_text() + "\n")
        return where

    def dump_histories(self, where: Path) -> None:
        self.recorder.dump(where / "history.jsonl")
        for workload in self.workloads:
            if workload.recorder is not self.recorder:
                workload.recorder.dump(where / f"history-{workload.label}.jsonl")

    def close(self) -> None:
        for node in self.nodes:
            proc = node.process.proc
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        for workload in self.workloads:
            workload.stop()
        if self.doors is not None:
            self.doors.close()


def build(cluster: Cluster, count: int = 3, doors: bool = False, code: Path | None = None,
          **settings: str) -> Harness:
    """`count` nodes started and linked, every one in the clients' directory; `code`: the
    source tree of an earlier release to run them on (tests/support/releases.py)."""
    nodes = cluster.make(count, **{**THREE, **settings})
    for node in nodes:
        node.process.code = code
    front = FrontDoors() if doors else None
    directory, recorder = Directory(), Recorder()
    replicated = nodes[0].settings.get("durable_storage.messages.backend") == RAFT
    harness = Harness(cluster, nodes, directory, recorder,
                      Nemesis(cluster, directory, recorder, front, replicated=replicated),
                      front)
    if replicated:
        harness.nemesis.raft_groups = 2 + n_shards(nodes[0])
    try:
        if front is not None:
            front.wire(nodes)
        for node in nodes:
            node.start()
        harness.nemesis.wait_healthy()
        harness.nemesis.publish_all()
    except BaseException:
        harness.close()
        raise
    return harness
