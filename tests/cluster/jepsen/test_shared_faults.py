"""The shared-subscription workload (shared.py) under each fault kind once: the members of
one durable shared subscription (durable sessions reconnecting to random nodes, now and then
one ending its session) share numbered QoS 1/2 messages while the nemesis works through
every fault kind of faults.py on one cluster, one fault after another. The history must
hold `check_shared`'s rules: every acknowledged message delivered, none to two members but
the QoS 1 deliveries of a member whose session ended (then without DUP), QoS 2 never twice.

builtin_raft only: every kind but three needs replicated Durable Storage, and with
builtin_local a group's members must all live on one node.
"""

import random

import pytest

from tests.cluster.jepsen.faults import REPLICATED_ONLY, TODAY, pick_fault, run_fault
from tests.cluster.jepsen.harness import RAFT, backend

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)
def test_a_durable_shared_group_under_every_fault_kind(jepsen) -> None:
    harness = jepsen(doors=True, **backend(RAFT), **{"node.dist_net_ticktime": "10s"})
    names = [node.name for node in harness.nodes]
    workload = harness.shared_workload(seed=11, publishers=4, rate=20.0, homes=["n1"],
                                       end_sessions=0.3)
    workload.start()
    rng = random.Random(11)
    for kind in TODAY + REPLICATED_ONLY:
        fault = pick_fault(kind, names, {"n1"}, rng)
        assert fault is not None
        run_fault(workload, harness.nemesis, fault, before=1.0, during=2.0, after=0.5)
    report = workload.finish(drain_timeout=30.0)
    print(report.summary(), workload.stats)
    if not report.ok:
        print(f"evidence kept in {harness.keep_evidence()}")
    assert report.ok, report.summary()
    assert report.subscribers == 3 and report.acknowledged > 300


@pytest.mark.timeout(180)
def test_a_durable_shared_group_whose_members_move_and_end(jepsen) -> None:
    """No fault: the members reconnect to random nodes all the time (each move a takeover
    through the replicated sessions database, the group's shards moving with them) and now
    and then one ends its session."""
    harness = jepsen(**backend(RAFT))
    workload = harness.shared_workload(seed=1, publishers=4, end_sessions=0.3)
    workload.start()
    workload.run_for(30)
    report = workload.finish(drain_timeout=30.0)
    if not report.ok:
        print(f"evidence kept in {harness.keep_evidence()}")
    assert report.ok, report.summary()
    assert report.subscribers == 3 and report.acknowledged > 300
