"""Leadership transfer in the sans-I/O core, one rule per test: the target is caught up
first, campaigns at once on TimeoutNow and is voted for despite the leader's lease; the
leader refuses what would move its log's end meanwhile; a transfer that cannot happen is
given up after an election timeout. (The seeded simulation runs transfers under faults.)"""

import random

import pytest

from broker.raft.core import (
    FOLLOWER,
    LEADER,
    ConfigChangeRefused,
    NotLeader,
    RaftGroup,
    TransferRefused,
)
from broker.raft.messages import (
    MalformedMessage,
    RequestVote,
    TimeoutNow,
    VoteResponse,
    decode,
    encode,
)
from tests.raft.test_core import Cluster


def test_a_caught_up_voter_takes_over_without_any_timer_running() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    index, _ = leader.propose(b"x")
    cluster.settle()
    term = leader.term
    leader.transfer_leadership("b")
    cluster.settle()  # no tick: neither an election timeout nor a heartbeat
    b = cluster.cores["b"]
    assert b.role == LEADER and b.term == term + 1
    assert leader.role == FOLLOWER and leader.leader == "b"
    assert (b.transfer_elections, b.elections, leader.transfers) == (1, 1, 1)
    assert b.log.term_at(index) == term  # what was committed stays
    assert leader.transferee is None


def test_a_lagging_target_is_caught_up_before_it_is_told_to_campaign() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    cluster.down.add("c")
    for i in range(20):
        leader.propose(b"%d" % i)
    cluster.settle()
    c = cluster.cores["c"]
    assert c.log.last_index < leader.log.last_index
    cluster.down.discard("c")
    leader.unreachable("c")
    leader.transfer_leadership("c")
    sent = leader.ready()
    assert not any(isinstance(m, TimeoutNow) for _, m in sent.messages)
    leader.persisted(sent.seq)
    for peer, message in sent.messages:
        cluster.cores[peer].step("a", message)
    cluster.settle()
    assert c.role == LEADER and c.log.last_index == leader.log.last_index
    assert [e.data for e in c.log.entries[-21:-1]] == [b"%d" % i for i in range(20)]


def test_proposals_and_membership_changes_are_refused_during_a_transfer() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    cluster.settle()
    cluster.down.add("b")
    leader.transfer_leadership("b")
    with pytest.raises(NotLeader) as refused:
        leader.propose(b"x")
    assert refused.value.leader == "b"  # where the command had better go
    with pytest.raises(ConfigChangeRefused, match="transfer"):
        leader.add_learner("d")
    leader.read_index("still served")  # a read moves no log's end


def test_a_transfer_to_a_cut_off_voter_is_given_up_after_an_election_timeout() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    cluster.settle()
    cluster.down.add("c")
    leader.transfer_leadership("c")
    for _ in range(leader.election_ticks - 1):
        leader.tick()
        cluster.cores["b"].tick()
        cluster.settle()
    assert leader.transferee == "c"
    leader.tick()
    assert leader.transferee is None and leader.transfers_aborted == 1
    assert leader.role == LEADER
    index, _ = leader.propose(b"after")
    cluster.settle()
    assert leader.commit >= index


def test_a_transfer_vote_is_granted_despite_a_live_leader_and_deposes_it() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    cluster.settle()
    term, last = leader.term, leader.log.last_index
    b = cluster.cores["b"]
    for core, name in ((b, "b"), (leader, "a")):
        core.step("c", RequestVote(1, term + 1, last, term, False, transfer=True))
        ready = core.ready()
        core.persisted(ready.seq)
        ((_, grant),) = ready.after_persist
        assert isinstance(grant, VoteResponse) and grant.granted, name
        assert core.term == term + 1 and core.vote == "c" and core.role == FOLLOWER


def test_only_another_voter_can_be_the_target_and_only_a_leader_transfers() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    with pytest.raises(TransferRefused):
        leader.transfer_leadership("a")
    with pytest.raises(TransferRefused):
        leader.transfer_leadership("d")
    with pytest.raises(NotLeader):
        cluster.cores["b"].transfer_leadership("c")


def test_a_learner_ignores_timeout_now() -> None:
    core = RaftGroup(1, "d", random.Random(1))  # not in any configuration it knows
    core.step("a", TimeoutNow(1, 3))
    assert core.role == FOLLOWER and core.elections == 0


def test_a_target_restarted_mid_transfer_lost_it_and_the_leader_goes_on() -> None:
    """The target crashes with TimeoutNow on its way (the message is lost) and comes back
    from its log: the transfer is given up, the group keeps its leader and every entry, and
    a second transfer to the restarted target succeeds."""
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    leader.propose(b"kept")
    cluster.settle()
    b = cluster.cores["b"]
    leader.transfer_leadership("b")
    ready = leader.ready()
    assert ("b", TimeoutNow(1, leader.term)) in ready.messages  # lost with b's crash
    leader.persisted(ready.seq)
    cluster.cores["b"] = RaftGroup(1, "b", random.Random(9), term=b.term, vote=b.vote,
                                   log=b.log, applied=b.applied_index)
    for _ in range(leader.election_ticks):
        leader.tick()
        cluster.settle()
    assert leader.role == LEADER and leader.transfers_aborted == 1
    leader.transfer_leadership("b")
    cluster.settle()
    assert cluster.cores["b"].role == LEADER
    assert any(e.data == b"kept" for e in cluster.cores["b"].log.entries)


def test_a_leader_restarted_mid_transfer_leaves_a_target_that_campaigns_normally() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    cluster.settle()
    leader.transfer_leadership("b")
    ready = leader.ready()
    cluster.cores["a"] = RaftGroup(1, "a", random.Random(7), term=leader.term,
                                   vote=leader.vote, log=leader.log)
    for peer, message in ready.messages:  # TimeoutNow still arrives
        cluster.cores[peer].step("a", message)
    cluster.settle()
    leaders = [core for core in cluster.cores.values() if core.role == LEADER]
    assert [core.id for core in leaders] == ["b"]
    assert cluster.cores["a"].transferee is None


def test_the_codec_keeps_0_1_0_decoders_safe() -> None:
    """A transfer's vote request has the size of any other, its flag a bit of the byte a
    0.1.0 node reads as "pre-vote"; TimeoutNow is a new type that one drops as unknown."""
    plain = encode(RequestVote(5, 7, 10, 6, False))
    transfer = encode(RequestVote(5, 7, 10, 6, False, transfer=True))
    assert len(plain) == len(transfer) and transfer[-1] == 2
    assert decode(transfer) == RequestVote(5, 7, 10, 6, False, True)
    assert decode(encode(TimeoutNow(5, 7))) == TimeoutNow(5, 7)
    with pytest.raises(MalformedMessage, match="flags"):
        decode(plain[:-1] + b"\x04")
    with pytest.raises(MalformedMessage):
        decode(encode(TimeoutNow(5, 7)) + b"x")
