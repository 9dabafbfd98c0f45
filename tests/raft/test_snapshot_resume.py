"""The core's side of a snapshot that ships files (broker/ds/shipped.py): a new replica gets
the snapshot rather than the whole log when the machine asks for it, the receiving machine
moves the transfer's offset (past what it kept, back to a damaged file), and a chunk the
machine held back (pacing its transfers) is asked for again when it says so."""

import random

from broker.raft.core import RaftGroup
from broker.raft.messages import Config, InstallSnapshot, SnapshotResponse
from broker.raft.progress import REPLICATE, SNAPSHOT
from broker.raft.ready import SnapshotChunk, SnapshotRequest
from tests.raft.test_core import Cluster, snapshot_asked_for_c


def with_new_learner(snapshot_empty_followers: bool) -> tuple[Cluster, RaftGroup]:
    cluster = Cluster("a", "b", "c")
    leader = cluster.elect("a")
    for n in range(5):
        leader.propose(b"%d" % n)
        cluster.settle()
    leader.snapshot_empty_followers = snapshot_empty_followers
    cluster.cores["d"] = RaftGroup(1, "d", random.Random("d"))
    leader.add_learner("d")
    cluster.settle()
    return cluster, leader


def test_a_new_replica_gets_the_snapshot_when_the_machine_prefers_it() -> None:
    cluster, leader = with_new_learner(True)
    assert leader.log.term_at(1) is not None  # the log was not compacted
    assert leader.progress["d"].state == SNAPSHOT
    assert cluster.cores["d"].log.last_index == 0  # no entry was sent to it
    # A follower that has a log still gets entries.
    assert leader.progress["b"].state == REPLICATE


def test_without_it_a_new_replica_replays_the_log() -> None:
    cluster, leader = with_new_learner(False)
    assert leader.progress["d"].state == REPLICATE
    assert cluster.cores["d"].log.last_index == leader.log.last_index


def chunk(term: int, offset: int, size: int, done: bool = False) -> InstallSnapshot:
    return InstallSnapshot(1, term, 5, term, Config(frozenset("abc")), offset, b"x" * size,
                           done)


def answers(follower: RaftGroup) -> list[tuple[str, object]]:
    ready = follower.ready()
    follower.persisted(ready.seq)
    return [*ready.messages, *ready.after_persist]


def received(follower: RaftGroup, message: InstallSnapshot) -> SnapshotChunk:
    follower.step("a", message)
    ready = follower.ready()
    follower.persisted(ready.seq)
    (stored,) = ready.snapshot_chunks
    return stored


def test_the_receiving_machine_moves_the_offset_forward_and_back() -> None:
    follower = RaftGroup(1, "d", random.Random(1))
    first = received(follower, chunk(2, 0, 10))
    follower.chunk_stored(first, True, resume=100)  # it holds 10..100 from before
    assert answers(follower) == [("a", SnapshotResponse(1, 2, 5, 100, False))]
    follower.step("a", chunk(2, 10, 10))  # sent before the answer arrived: refused
    assert answers(follower) == [("a", SnapshotResponse(1, 2, 5, 100, False))]
    last = received(follower, chunk(2, 100, 10, done=True))
    follower.chunk_stored(last, True, resume=40)  # a file failed its checksum
    assert answers(follower) == [("a", SnapshotResponse(1, 2, 5, 40, False))]
    assert follower.log.snapshot_index == 0  # not installed
    again = received(follower, chunk(2, 40, 70, done=True))
    follower.chunk_stored(again, True)
    assert follower.log.snapshot_index == 5
    assert answers(follower) == [("a", SnapshotResponse(1, 2, 5, 0, True))]


def test_a_chunk_the_machine_held_back_is_asked_for_again_when_it_may_leave() -> None:
    leader = snapshot_asked_for_c()
    index = leader.commit
    leader.send_snapshot_chunk("c", index, 0, b"x" * 10, False)
    leader.ready()
    leader.step("c", SnapshotResponse(1, leader.term, index, 10, False))
    assert leader.ready().snapshot_requests == [SnapshotRequest("c", index, 10)]
    # The machine answered None (over its byte rate): nothing more until it says so.
    assert not leader.has_ready()
    leader.snapshot_ready()
    assert leader.ready().snapshot_requests == [SnapshotRequest("c", index, 10)]
    leader.send_snapshot_chunk("c", index, 10, b"y" * 10, True)
    leader.snapshot_ready()  # given: nothing to ask again
    assert leader.ready().snapshot_requests == []
