"""`RaftGroup.peer_lost`: a leader whose link its followers see closed is replaced without an
election timeout, and a link that only dropped (the leader alive) disturbs nothing.
Counted in ticks of the cores' logical clock, never in seconds."""

from broker.raft.core import FOLLOWER, LEADER, PRE_CANDIDATE
from tests.raft.test_core import Cluster


def _three() -> tuple[Cluster, str]:
    cluster = Cluster("a", "b", "c")
    cluster.elect("a")
    cluster.settle()
    return cluster, "a"


def test_the_first_survivor_campaigns_at_once_when_the_leaders_link_closes() -> None:
    cluster, leader = _three()
    term = cluster.cores["b"].term
    cluster.down.add(leader)  # killed: both survivors see its connection close
    for name in ("b", "c"):
        cluster.cores[name].peer_lost(leader)
    cluster.settle()
    # No tick has passed: b (first of the survivors by ID) stood and won at once.
    b, c = cluster.cores["b"], cluster.cores["c"]
    assert b.role == LEADER and b.term == term + 1
    assert c.role == FOLLOWER and c.leader == "b"


def test_the_next_survivor_stands_two_ticks_later_when_the_first_is_gone_too() -> None:
    cluster = Cluster("a", "b", "c", "d", "e")
    cluster.elect("a")
    cluster.settle()
    cluster.down.update({"a", "b"})
    for name in ("c", "d", "e"):
        cluster.cores[name].peer_lost("a")
    cluster.settle()
    c, d, e = (cluster.cores[name] for name in ("c", "d", "e"))
    assert LEADER not in (c.role, d.role, e.role)  # c waits: b, first, might stand
    for _ in range(2):
        assert c.role != LEADER
        for core in (c, d, e):
            core.tick()
        cluster.settle()
    assert c.role == LEADER


def test_a_dropped_link_to_a_live_leader_fails_the_pre_vote_and_changes_no_term() -> None:
    cluster, leader = _three()
    a, b, c = (cluster.cores[name] for name in ("a", "b", "c"))
    term = a.term
    b.peer_lost(leader)  # only b's link to a dropped; c still hears a
    cluster.settle()
    assert b.role == PRE_CANDIDATE and a.role == LEADER and c.leader == leader
    assert (a.term, b.term, c.term) == (term, term, term)
    # The link comes back: a's next heartbeat makes b its follower again.
    for _ in range(a.heartbeat_ticks):
        a.tick()
    cluster.settle()
    assert b.role == FOLLOWER and b.leader == leader and b.term == term
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
    """b learns of the crash first and asks c, which still hears a and ignores it; c's own
    news comes next. c must not leave b waiting an election timeout: here c's log is behind
    b's, so c standing itself could not win."""
    cluster, leader = _three()
    a, b, c = (cluster.cores[name] for name in ("a", "b", "c"))
    cluster.down.add("c")
    a.propose(b"only b has it")
    cluster.settle()
    assert b.log.last_index > c.log.last_index
    cluster.down.add(leader)
    cluster.down.discard("c")
    b.peer_lost(leader)
    cluster.settle()
    assert b.role == PRE_CANDIDATE and c.leader == leader  # ignored: c heard a lately
    c.peer_lost(leader)
    cluster.settle()
    assert b.role == LEADER and c.leader == "b"

