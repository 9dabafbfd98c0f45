"""`RaftGroup.peer_lost`: a leader whose link its followers see closed is replaced without an
election timeout, and a link that only dropped (the leader alive) disturbs nothing.
Counted in ticks of the cores' logical clock, never in seconds."""

import random

import pytest

from broker.raft.core import FOLLOWER, LEADER, PRE_CANDIDATE, RaftGroup
from broker.raft.messages import Config
from tests.raft.test_core import Cluster


def _three() -> tuple[Cluster, str]:
    cluster = Cluster("a", "b", "c")
    cluster.elect("a")
    cluster.settle()
    return cluster, "a"


def test_the_first_survivor_campaigns_at_once_when_the_leaders_link_closes() -> None:
    cluster, leader = _three()
    term = cluster.cores["b"].term
    first, second = cluster.cores["b"].succession(leader)
    assert cluster.cores["c"].succession(leader) == [first, second]
    cluster.down.add(leader)  # killed: both survivors see its connection close
    for name in ("b", "c"):
        cluster.cores[name].peer_lost(leader)
    cluster.settle()
    # No tick has passed: the first in succession stood and won at once.
    assert cluster.cores[first].role == LEADER and cluster.cores[first].term == term + 1
    assert cluster.cores[second].role == FOLLOWER and cluster.cores[second].leader == first


def test_successions_differ_by_group_and_term() -> None:
    orders = set()
    for group in range(3):
        core = RaftGroup(group, "a", random.Random(1))
        core.bootstrap(Config(frozenset("abcd")))
        for term in range(3):
            core.term = term
            orders.add(tuple(core.succession("a")))
    assert orders == {("b", "c", "d"), ("c", "d", "b"), ("d", "b", "c")}


def test_the_next_survivor_stands_two_ticks_later_when_the_first_is_gone_too() -> None:
    cluster = Cluster("a", "b", "c", "d", "e")
    cluster.elect("a")
    cluster.settle()
    first, second, *rest = cluster.cores["b"].succession("a")
    cluster.down.update({"a", first})
    alive = [cluster.cores[name] for name in (second, *rest)]
    for core in alive:
        core.peer_lost("a")
    cluster.settle()
    assert all(core.role != LEADER for core in alive)  # the first might stand: wait
    for _ in range(2):
        assert cluster.cores[second].role != LEADER
        for core in alive:
            core.tick()
        cluster.settle()
    assert cluster.cores[second].role == LEADER


@pytest.mark.parametrize("place", [0, 1])
def test_a_dropped_link_to_a_live_leader_fails_the_pre_vote_and_changes_no_term(
        place: int) -> None:
    cluster, leader = _three()
    a = cluster.cores[leader]
    follower = cluster.cores[a.succession(leader)[place]]
    other = cluster.cores[a.succession(leader)[1 - place]]
    term = a.term
    follower.peer_lost(leader)  # only its link to the leader dropped; the other hears it
    for _ in range(2 * place):
        follower.tick()
    cluster.settle()
    assert follower.role == PRE_CANDIDATE and a.role == LEADER and other.leader == leader
    assert (a.term, follower.term, other.term) == (term, term, term)
    # The link comes back: the leader probes it, which makes it a follower again.
    a.unreachable(follower.id)
    cluster.settle()
    assert follower.role == FOLLOWER and follower.leader == leader and follower.term == term
    assert a.role == LEADER and a.term == term


def test_a_flapping_link_never_unseats_a_leader() -> None:
    cluster, leader = _three()
    a = cluster.cores[leader]
    term = a.term
    for flap in range(200):
        follower = "bc"[flap % 2]
        cluster.cores[follower].peer_lost(leader)
        cluster.settle()
        for core in cluster.cores.values():
            core.tick()
        cluster.settle()
        a.propose(b"%d" % flap)
        cluster.settle()
    assert a.role == LEADER and a.term == term
    assert all(core.term == term for core in cluster.cores.values())
    assert all(core.commit == a.log.last_index for core in cluster.cores.values())


def test_a_pre_vote_ignored_for_a_live_leader_is_granted_once_that_leader_is_lost() -> None:
    """The first survivor learns of the crash first and asks the other, which still hears
    the leader and ignores it; the other's own news comes next. It must not leave the first
    waiting an election timeout: here its log is behind, so standing itself could not
    win."""
    cluster, leader = _three()
    a = cluster.cores[leader]
    first, second = (cluster.cores[name] for name in a.succession(leader))
    cluster.down.add(second.id)
    a.propose(b"only the first survivor has it")
    cluster.settle()
    assert first.log.last_index > second.log.last_index
    cluster.down.add(leader)
    cluster.down.discard(second.id)
    first.peer_lost(leader)
    cluster.settle()
    assert first.role == PRE_CANDIDATE and second.leader == leader  # ignored: heard lately
    second.peer_lost(leader)
    cluster.settle()
    assert first.role == LEADER and second.leader == first.id


def test_a_learner_forgets_a_lost_leader_and_does_not_stand() -> None:
    cluster, leader = _three()
    cluster.cores["d"] = RaftGroup(1, "d", random.Random(4))
    cluster.cores[leader].add_learner("d")
    cluster.settle()
    d = cluster.cores["d"]
    assert d.leader == leader and "d" in d.log.config.learners
    d.peer_lost(leader)
    assert d.leader is None and d.role == FOLLOWER
    for _ in range(d.election_ticks * 3):
        d.tick()
        assert not d.ready().messages
