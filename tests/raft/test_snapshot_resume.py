"""The core's side of a snapshot that ships files (broker/ds/shipped.py): a new replica gets
the snapshot rather than the whole log when the machine asks for it, the receiving machine
moves the transfer's offset (past what it kept, back to a damaged file), a chunk the
machine held back (pacing its transfers) is asked for again when it says so, and the leader
keeps a window of chunks in flight."""

import random

from broker.raft.core import RaftGroup
from broker.raft.messages import Config, InstallSnapshot, SnapshotResponse
from broker.raft.progress import REPLICATE, SNAPSHOT, SNAPSHOT_WINDOW
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
    # The next chunk is asked for at once, while the follower stores this one.
    assert leader.ready().snapshot_requests == [SnapshotRequest("c", index, 10)]
    # The machine answered None (over its byte rate): nothing more until it says so.
    leader.step("c", SnapshotResponse(1, leader.term, index, 10, False))
    assert leader.ready().snapshot_requests == []
    assert not leader.has_ready()
    leader.snapshot_ready()
    assert leader.ready().snapshot_requests == [SnapshotRequest("c", index, 10)]
    leader.send_snapshot_chunk("c", index, 10, b"y" * 10, True)
    leader.snapshot_ready()  # given: nothing to ask again
    assert leader.ready().snapshot_requests == []


def serve(leader: RaftGroup, index: int, size: int, last: int) -> list[int]:
    """Answers every chunk the leader asks for (chunks of `size`, the one at `last` the
    end of the snapshot), until it asks for none; the offsets of the chunks it sends c."""
    sent = []
    while True:
        ready = leader.ready()
        sent += [m.offset for peer, m in ready.messages
                 if peer == "c" and isinstance(m, InstallSnapshot)]
        if not ready.snapshot_requests:
            return sent
        for request in ready.snapshot_requests:
            leader.send_snapshot_chunk("c", index, request.offset, b"x" * size,
                                       request.offset == last)


def test_chunks_are_sent_up_to_a_window_ahead_of_the_answers() -> None:
    leader = snapshot_asked_for_c()
    index = leader.commit
    leader.snapshot_ready()
    window = [0, 10, 20, 30][:SNAPSHOT_WINDOW]
    assert serve(leader, index, 10, 90) == window
    for end in range(10, 60, 10):  # each answer lets one more chunk leave
        leader.step("c", SnapshotResponse(1, leader.term, index, end, False))
        assert serve(leader, index, 10, 90) == [end + 10 * (SNAPSHOT_WINDOW - 1)]


def test_after_the_follower_moves_the_transfer_what_was_in_flight_is_sent_again_once() -> None:
    leader = snapshot_asked_for_c()
    index = leader.commit
    leader.snapshot_ready()
    serve(leader, index, 10, 90)
    # The follower stored the chunk at 0 and holds 10..70 from before: it asks for 70.
    leader.step("c", SnapshotResponse(1, leader.term, index, 70, False))
    assert serve(leader, index, 10, 90) == [70, 80, 90]  # 90 is the last: nothing after it
    # Its refusals of the chunks sent before (10, 20, 30) all say 70 again: no news.
    for _ in range(SNAPSHOT_WINDOW - 1):
        leader.step("c", SnapshotResponse(1, leader.term, index, 70, False))
    assert serve(leader, index, 10, 90) == []
    leader.step("c", SnapshotResponse(1, leader.term, index, 80, False))
    assert serve(leader, index, 10, 90) == []
    # A file failed its checksum: back to where it starts.
    leader.step("c", SnapshotResponse(1, leader.term, index, 40, False))
    assert serve(leader, index, 10, 90) == [40, 50, 60, 70][:SNAPSHOT_WINDOW]
    # The follower stored 40 (the window moves on to 80), then missed 50 and refuses 60:
    # what was in flight goes again from 50; the machine's answer for 80, asked for
    # before that, is not sent.
    leader.step("c", SnapshotResponse(1, leader.term, index, 50, False))
    leader.step("c", SnapshotResponse(1, leader.term, index, 50, False))
    requests = leader.ready().snapshot_requests
    assert [r.offset for r in requests] == [80, 50]
    leader.send_snapshot_chunk("c", index, 80, b"x" * 10, False)
    leader.send_snapshot_chunk("c", index, 50, b"x" * 10, False)
    assert serve(leader, index, 10, 90) == [50, 60, 70, 80][:SNAPSHOT_WINDOW]


def test_an_install_answered_after_the_transfer_timed_out_still_counts() -> None:
    """A follower installing a large snapshot holds its event loop for longer than an
    election timeout: the leader, which started over meanwhile, takes its answer rather
    than sending the whole snapshot again."""
    leader = snapshot_asked_for_c()
    index = leader.commit
    leader.snapshot_ready()
    serve(leader, index, 10, 0)  # one chunk, the last
    for _ in range(leader.election_ticks + 1):
        leader.tick()
    assert leader.progress["c"].snapshot_index == 0  # given up: it starts over
    leader.step("c", SnapshotResponse(1, leader.term, index, 0, True))
    assert leader.progress["c"].match == index
    assert leader.progress["c"].state != SNAPSHOT
