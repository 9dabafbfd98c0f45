"""Fault tests on 3 real nodes: publishers and reconnecting durable subscribers on random
nodes, a fault, then the history checked (nothing acknowledged lost, order per publisher and
QoS, QoS 2 once, nothing unexpected, sessions kept). Each runs on both Durable Storage
backends: `builtin_local` (the default: a durable session and its messages live on one
node) and `builtin_raft` (replicated).

With `builtin_local` the faults it survives pass; those that need replicated Durable Storage
(a session's node lost, a minority that must not acknowledge) are strict xfails: they run,
and an unexpected pass fails, saying the mark should go. With `builtin_raft` every test
must pass.

Subscribers' sessions start on the node of their first connection (`homes`): the faults
that must pass with `builtin_local` hit the other nodes.
"""

import pytest

from tests.cluster.jepsen.faults import (
    Fault,
    KillAll,
    KillNode,
    Partition,
    Pause,
    WipeNode,
    run_fault,
)
from tests.cluster.jepsen.harness import LOCAL, RAFT, Harness, backend
from tests.cluster.jepsen.history import Report
from tests.cluster.jepsen.workload import Workload

pytestmark = pytest.mark.integration

NEEDS_REPLICATION = pytest.mark.xfail(
    strict=True, reason="needs replicated Durable Storage (issue 18): with builtin_local a"
    " durable session and its messages live on one node")

BOTH = pytest.mark.parametrize("storage", [
    pytest.param(LOCAL, id="local"), pytest.param(RAFT, id="raft")])
REPLICATED = pytest.mark.parametrize("storage", [
    pytest.param(LOCAL, id="local", marks=NEEDS_REPLICATION),
    pytest.param(RAFT, id="raft")])

# A freeze shorter than failure detection: peers keep the node's links and routes.
SLOW_DETECTION = {"node.dist_net_ticktime": "10s"}


def _run(harness: Harness, fault: Fault | None, *, seed: int, during: float = 4.0,
         drain: float = 30.0, **config: object) -> tuple[Report, Workload]:
    workload = harness.workload(seed=seed, **config)
    workload.start()
    run_fault(workload, harness.nemesis, fault, during=during)
    report = workload.finish(drain_timeout=drain)
    print(report.summary(), workload.stats)
    if not report.ok:
        print(f"evidence kept in {harness.keep_evidence()}")
    return report, workload


# ---- both backends ------------------------------------------------------------------------
@BOTH
def test_no_faults(jepsen, storage: str) -> None:
    harness = jepsen(**backend(storage))
    report, workload = _run(harness, None, seed=1, homes=["n1", "n2"])
    assert report.ok, report.summary()
    assert report.subscribers == 3 and report.acknowledged > 100
    assert report.unknown == 0
    assert workload.stats.subscriber_connections > 3  # subscribers did come back
    if storage == LOCAL:
        assert workload.stats.redirects > 0  # through other nodes


@BOTH
def test_kill_9_of_a_node_without_sessions_then_restart(jepsen, storage: str) -> None:
    harness = jepsen(**backend(storage))
    before = harness.nodes[2].pid
    report, _ = _run(harness, KillNode("n3"), seed=2, homes=["n1", "n2"])
    assert report.ok, report.summary()
    assert harness.nodes[2].pid != before
    assert report.acknowledged > 100


@BOTH
def test_sigstop_of_a_node_without_sessions_then_sigcont(jepsen, storage: str) -> None:
    """Frozen 4 s, under the failure detector's 10 s: clients on it give up (keepalive 2 s)
    and send again elsewhere; nothing it had is lost when it wakes."""
    harness = jepsen(**backend(storage), **SLOW_DETECTION)
    report, _ = _run(harness, Pause("n3"), seed=3, homes=["n1", "n2"])
    assert report.ok, report.summary()
    assert report.acknowledged > 100


@BOTH
def test_sigstop_of_a_majority_without_sessions_then_sigcont(jepsen, storage: str) -> None:
    harness = jepsen(**backend(storage), **SLOW_DETECTION)
    report, _ = _run(harness, Pause("n2", "n3"), seed=4, homes=["n1"])
    assert report.ok, report.summary()
    assert report.acknowledged > 100


@BOTH
def test_kill_9_of_every_node_at_once_then_restart(jepsen, storage: str) -> None:
    """Sessions and stored messages are on the nodes' disks: all come back. With
    builtin_local the publishers use the sessions' node: another node acknowledges once it
    has forwarded a message, so killing every node a moment later may lose it (found by
    `make chaos REPLICATED=1`, about 1 kill-all in 15)."""
    harness = jepsen(**backend(storage))
    where = {"homes": ["n1"], "publisher_nodes": ["n1"]} if storage == LOCAL else {
        "homes": ["n1", "n2"]}
    report, _ = _run(harness, KillAll(["n1", "n2", "n3"]), seed=5, during=1.0, **where)
    assert report.ok, report.summary()
    assert report.acknowledged > 100


# ---- replicated Durable Storage only ---------------------------------------------------------
@REPLICATED
def test_kill_9_of_the_node_holding_the_sessions_then_restart(jepsen, storage: str) -> None:
    """While n1 is down its subscribers reconnect elsewhere: their sessions must resume
    there (builtin_local: Session Present 0, a second session), and what other nodes acknowledge
    meanwhile must reach them."""
    harness = jepsen(**backend(storage))
    report, _ = _run(harness, KillNode("n1"), seed=6, homes=["n1"], drain=10.0)
    assert report.ok, report.summary()


@REPLICATED
def test_kill_9_of_the_node_holding_the_sessions_with_its_data_dir_deleted(
        jepsen, storage: str) -> None:
    harness = jepsen(**backend(storage))
    report, _ = _run(harness, WipeNode("n1"), seed=7, homes=["n1"], drain=10.0)
    assert report.ok, report.summary()


@REPLICATED
def test_a_node_frozen_past_failure_detection_acknowledges_only_what_it_can_deliver(
        jepsen, storage: str) -> None:
    """n3 frozen 4 s (ticktime 2 s) with every publisher on it (keepalive long enough to
    stay): its peers drop its links; when it wakes it acknowledges the PUBLISHes waiting in
    its sockets, which it can no longer forward (builtin_local: lost)."""
    harness = jepsen(**backend(storage))
    report, _ = _run(harness, Pause("n3"), seed=8, homes=["n1", "n2"], keepalive=30,
                     publisher_nodes=["n3"], drain=10.0)
    assert report.ok, report.summary()


@REPLICATED
def test_an_isolated_minority_acknowledges_nothing(jepsen, storage: str) -> None:
    """n3 cut from n1 and n2 (publishers on n3, sessions on n1): n3 must not acknowledge
    durable publishes it cannot get a majority for (builtin_local does, and they are
    lost)."""
    harness = jepsen(doors=True, **backend(storage))
    report, _ = _run(harness, Partition([["n3"], ["n1", "n2"]], kind="isolate"), seed=9,
                     homes=["n1"], publisher_nodes=["n3"], drain=10.0)
    assert report.ok, report.summary()


@REPLICATED
def test_a_bridge_partition_loses_nothing(jepsen, storage: str) -> None:
    """Only the n1-n2 link cut (n3 still sees both): publishers on n2, sessions on n1
    (builtin_local: n2 acknowledges what it can no longer forward)."""
    harness = jepsen(doors=True, **backend(storage))
    report, _ = _run(harness, Partition(pairs=[("n1", "n2")], kind="bridge"), seed=10,
                     homes=["n1"], publisher_nodes=["n2"], drain=10.0)
    assert report.ok, report.summary()
