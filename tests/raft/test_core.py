"""The sans-I/O core on its own: what leaves before and after the disk, pre-vote,
check-quorum, learners and membership, one rule per test."""

import random

import pytest

from broker.raft.core import LEADER, ConfigChangeRefused, NotLeader, RaftGroup
from broker.raft.messages import (
    AppendEntries,
    AppendResponse,
    Commit,
    Config,
    Entry,
    RequestVote,
    VoteResponse,
)
from broker.raft.progress import SNAPSHOT
from broker.raft.ready import SnapshotRequest


class Cluster:
    """Cores over a perfect network and a disk that syncs when told."""

    def __init__(self, *nodes: str) -> None:
        self.cores = {n: RaftGroup(1, n, random.Random(n)) for n in nodes}
        for core in self.cores.values():
            core.bootstrap(Config(frozenset(nodes)))
        self.down: set[str] = set()

    def settle(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            quiet = True
            for name, core in self.cores.items():
                if name in self.down or not core.has_ready():
                    continue
                quiet = False
                ready = core.ready()
                core.persisted(ready.seq)
                for peer, message in ready.messages + ready.after_persist:
                    if peer not in self.down and name not in self.down:
                        self.cores[peer].step(name, message)
            if quiet:
                return

    def elect(self, node: str) -> RaftGroup:
        core = self.cores[node]
        for _ in range(core.election_ticks * 2):
            core.tick()
            self.settle()
            if core.role == LEADER:
                return core
        raise AssertionError(f"{node} was not elected")


def test_a_single_voter_commits_only_what_it_persisted() -> None:
    core = RaftGroup(1, "a", random.Random(1))
    core.bootstrap(Config(frozenset({"a"})))
    while core.role != LEADER:
        core.tick()
        core.persisted(core.ready().seq)
    core.persisted(core.ready().seq)
    index, _ = core.propose(b"x")
    ready = core.ready()
    assert [e.index for e in ready.entries] == [index]
    assert core.commit < index and index not in [e.index for e in ready.committed]
    core.persisted(ready.seq)
    assert [e.data for e in core.ready().committed] == [b"x"]


def test_a_vote_and_an_acknowledgement_leave_only_after_the_disk() -> None:
    core = RaftGroup(1, "b", random.Random(1))
    core.bootstrap(Config(frozenset({"a", "b", "c"})))
    core.persisted(core.ready().seq)
    core.step("a", RequestVote(1, 2, 1, 1, False))
    ready = core.ready()
    assert ready.hard_state is not None and ready.hard_state.vote == "a"
    assert not ready.messages and isinstance(ready.after_persist[0][1], VoteResponse)
    core.persisted(ready.seq)
    core.step("a", AppendEntries(1, 2, 1, 1, 0, [Entry(2, 2, 0, b"x")]))
    ready = core.ready()
    assert [e.index for e in ready.entries] == [2]
    acknowledgement = ready.after_persist[0][1]
    assert not ready.messages and isinstance(acknowledgement, AppendResponse)
    assert acknowledgement.index == 2
    # Entries already on disk are acknowledged at once.
    core.persisted(ready.seq)
    core.step("a", AppendEntries(1, 2, 1, 1, 0, [Entry(2, 2, 0, b"x")]))
    assert core.ready().messages


def test_pre_vote_raises_no_term_and_a_live_leader_keeps_its_followers() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    term = leader.term
    # c is cut off, times out over and over: its pre-votes fail, no term moves.
    cluster.down.add("c")
    c = cluster.cores["c"]
    for _ in range(c.election_ticks * 5):
        c.tick()
        c.ready()
    assert c.term == term
    # Its pre-vote reaching b, which hears from a live leader, is ignored.
    b = cluster.cores["b"]
    b.step("c", RequestVote(1, term + 1, 99, term, True))
    assert not b.ready().messages and b.term == term


def test_a_leader_cut_off_from_its_majority_steps_down() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    cluster.down.update({"b", "c"})
    for _ in range(leader.election_ticks * 2 + 1):
        leader.tick()
        cluster.settle()
    assert leader.role != LEADER
    with pytest.raises(NotLeader):
        leader.propose(b"x")


@pytest.mark.parametrize("entries, catch_up_entries", [
    (50, 10),  # far behind
    (5, 1000),  # a new learner that holds nothing, however short the log
], ids=["far-behind", "holds-nothing"])
def test_a_learner_is_promoted_only_once_caught_up(entries: int, catch_up_entries: int) -> None:
    cluster = Cluster("a", "b", "c")
    cluster.cores["d"] = RaftGroup(1, "d", random.Random(4))  # joins empty
    leader = cluster.elect("a")
    for i in range(entries):
        leader.propose(b"%d" % i)
    cluster.settle()
    cluster.down.add("d")
    leader.catch_up_entries = catch_up_entries
    leader.add_learner("d")
    cluster.settle()
    with pytest.raises(ConfigChangeRefused, match="caught up"):
        leader.promote("d")
    cluster.down.discard("d")
    for _ in range(3):
        leader.tick()
        cluster.settle()
    leader.promote("d")
    cluster.settle()
    d = cluster.cores["d"]
    assert d.log.config.voters == {"a", "b", "c", "d"}
    assert d.log.last_index == leader.log.last_index


def test_one_membership_change_at_a_time_and_a_removed_leader_steps_down() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    cluster.settle()
    leader.remove("a")
    with pytest.raises(ConfigChangeRefused, match="in progress"):
        leader.remove("b")
    cluster.settle()
    assert leader.role != LEADER
    for core in cluster.cores.values():
        assert core.log.config.voters == {"b", "c"}
    # The removed server never campaigns, however long it waits.
    for _ in range(leader.election_ticks * 5):
        leader.tick()
        assert not leader.ready().messages


def test_a_leader_counts_itself_toward_a_commit_only_once_on_its_disk() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    index, _ = leader.propose(b"x")
    ready = leader.ready()  # written, not yet synced
    b = cluster.cores["b"]
    for peer, message in ready.messages:
        if peer == "b":
            b.step("a", message)
    answer = b.ready()
    b.persisted(answer.seq)
    for _, message in answer.after_persist:
        leader.step("b", message)
    assert leader.commit < index  # b alone is no majority
    leader.persisted(ready.seq)
    assert leader.commit == index


def test_the_only_voter_campaigns_on_its_first_tick() -> None:
    core = RaftGroup(1, "a", random.Random(1))
    core.bootstrap(Config(frozenset({"a"})))
    core.persisted(core.ready().seq)
    core.tick()
    core.persisted(core.ready().seq)
    assert core.role == LEADER
    # Restarted from its log, it does not wait an election timeout either.
    again = RaftGroup(1, "a", random.Random(2), term=core.term, vote="a", log=core.log)
    again.tick()
    again.persisted(again.ready().seq)
    assert again.role == LEADER


def test_appends_lost_with_a_link_are_sent_again_once_the_peer_is_unreachable() -> None:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    cluster.settle()
    cluster.down.add("c")  # the link drops: what is sent to c meanwhile is lost
    for i in range(5):
        leader.propose(b"%d" % i)
    cluster.settle()
    c = cluster.cores["c"]
    cluster.down.discard("c")
    for _ in range(3):  # heartbeats alone do not show the gap
        leader.tick()
        cluster.settle()
    assert c.log.last_index < leader.log.last_index
    leader.unreachable("c")
    cluster.settle()
    assert c.log.last_index == leader.log.last_index


@pytest.mark.parametrize("seed", range(60))
def test_survivors_elect_a_new_leader_within_two_election_timeouts(seed: int) -> None:
    """After the leader dies, a survivor that starts a pre-vote forgets the dead leader;
    before, the other survivor's pre-vote was ignored for a whole timeout after its own, and
    unlucky timeouts made elections take up to 16 timeouts."""
    rng = random.Random(seed)
    cluster = Cluster("a", "b", "c")
    for name in cluster.cores:
        cluster.cores[name] = RaftGroup(1, name, random.Random(rng.random()), election_ticks=10,
                                        heartbeat_ticks=2)
        cluster.cores[name].bootstrap(Config(frozenset(cluster.cores)))
    leader = cluster.elect("a")
    for _ in range(7):
        for core in cluster.cores.values():
            core.tick()
        cluster.settle()
    cluster.down.add(leader.id)
    survivors = [core for name, core in cluster.cores.items() if name != leader.id]
    for _ in range(2 * 10):
        for core in survivors:
            core.tick()
            cluster.settle()
        if any(core.role == LEADER for core in survivors):
            return
    raise AssertionError("no new leader within two election timeouts")


def test_followers_learn_a_new_commit_index_without_waiting_for_a_heartbeat() -> None:
    """A command forwarded through a follower is answered once that follower applies it: the
    commit index must reach it as soon as the leader has it, not a heartbeat later."""
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    index, _ = leader.propose(b"x")
    cluster.settle()  # no tick: no heartbeat goes out
    assert leader.commit >= index
    assert all(cluster.cores[n].commit >= index for n in ("b", "c"))


def test_a_commit_notice_names_only_what_the_follower_matches_and_is_not_answered() -> None:
    """The notice is not checked against the follower's log as an append is, so it may
    name only entries the follower acknowledged; answering it would cost the leader one
    more message per entry and follower and tell it nothing."""
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    cluster.settle()
    b = cluster.cores["b"]
    index, _ = leader.propose(b"x")
    ready = leader.ready()
    leader.persisted(ready.seq)
    b.step("a", dict(ready.messages)["b"])  # c's copy is still on its way
    ready_b = b.ready()
    b.persisted(ready_b.seq)
    ((_, acknowledgement),) = ready_b.after_persist
    leader.step("b", acknowledgement)
    notices = dict(leader.ready().messages)
    assert leader.commit == index
    assert notices == {"b": Commit(1, leader.term, index)}  # c matches none of it yet
    b.step("a", notices["b"])
    assert b.commit == index
    answer = b.ready()
    assert not answer.messages and not answer.after_persist


def snapshot_asked_for_c(cluster: Cluster | None = None) -> RaftGroup:
    """A leader of a, b, c whose log was compacted while c was down: c needs a snapshot,
    which the leader asked its machine for (the request dropped: no machine here).
    `cluster`: one of a, b and c whose a is hosted elsewhere (a RaftHost's)."""
    cluster = cluster or Cluster("a", "b", "c")
    leader = cluster.elect("a")
    cluster.down.add("c")
    for n in range(5):
        leader.propose(b"%d" % n)
        cluster.settle()
    leader.applied(leader.commit)
    leader.compact(leader.commit)  # c is now behind the leader's first entry
    cluster.down.discard("c")
    leader.unreachable("c")  # its link is back: what was lost on it is sent again
    cluster.settle()  # the request is made, and dropped here: the machine answered None
    assert leader.progress["c"].state == SNAPSHOT
    return leader


def test_a_snapshot_the_machine_prepared_late_is_asked_for_again_at_once() -> None:
    """A state machine answers a snapshot request with None while it prepares the snapshot
    (a shard dumps it on a worker thread); once it has it, the follower's request is made
    again now rather than after the transfer's timeout, and only once."""
    leader = snapshot_asked_for_c()
    assert not leader.has_ready()
    leader.snapshot_ready()
    leader.snapshot_ready()
    assert leader.ready().snapshot_requests == [SnapshotRequest("c", 0, 0)]
