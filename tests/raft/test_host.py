"""The host's flush on a real write-ahead log: the order of the log write and the apply."""

import random
from collections.abc import Callable
from pathlib import Path

from broker.raft.core import LEADER
from broker.raft.host import HostBatch, RaftHost
from broker.raft.messages import (
    NORMAL,
    Config,
    Entry,
    InstallSnapshot,
    SnapshotResponse,
    decode,
    encode,
)
from broker.raft.progress import SNAPSHOT_WINDOW
from broker.raft.ready import SnapshotChunk
from broker.raft.wal import FileStore, WriteAheadLog
from tests.raft.test_core import Cluster, snapshot_asked_for_c


class Recording:
    """A state machine that notes its applies in a list shared with the log writer."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def apply(self, entry: Entry) -> None:
        if entry.kind == NORMAL:
            self.events.append(f"apply {entry.data.decode()}")

    def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool]:
        raise AssertionError("no compaction in this test")

    def install_chunk(self, chunk: SnapshotChunk) -> None:
        raise AssertionError("no compaction in this test")


class Nowhere:
    def send(self, peer: str, data: bytes) -> None:
        raise AssertionError("a single voter sends nothing")

    def flush(self) -> None:
        pass


def test_a_flush_hands_its_log_write_out_before_it_applies(tmp_path: Path) -> None:
    """On a follower the apply of entry N would otherwise hold back the fsync of N+1, which
    the leader's commit waits for: the writer gets the batch first."""
    events: list[str] = []
    wal = WriteAheadLog(FileStore(str(tmp_path)))
    host = RaftHost("a", wal, Nowhere(), random.Random(7))
    core = host.add_group(1, Recording(events), voters=frozenset({"a"}))

    def write(batch: HostBatch) -> None:
        assert batch.wal is not None
        events.append("write")
        wal.write(batch.wal)
        wal.sync([batch.wal])

    def flush() -> None:
        batch = host.flush(write)
        if batch is not None and batch.wal is not None:
            host.synced(batch)

    for _ in range(100):
        host.tick()
        flush()
        if core.role == LEADER:
            break
    assert core.role == LEADER
    flush()  # the leader's first entry, committed
    events.clear()
    host.propose(1, b"A", lambda ok: None)
    flush()  # A written; committed once synced
    host.propose(1, b"B", lambda ok: None)
    flush()  # B written, then A applied
    flush()  # B applied (nothing to write)
    assert events == ["write", "write", "apply A", "apply B"]


class Wire:
    """Holds what a host sends until it flushes, as the cluster links hold a loop turn's
    frames: what a flush left behind would wait for the end of a busy leader's turn."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.queued: list[tuple[str, bytes]] = []
        self.out: list[tuple[str, bytes]] = []

    def send(self, peer: str, data: bytes) -> None:
        self.queued.append((peer, data))

    def flush(self) -> None:
        if self.queued:
            self.events.append(f"sent {len(self.queued)}")
            self.out += self.queued
            self.queued.clear()


def test_messages_leave_with_the_flush_that_made_them(tmp_path: Path) -> None:
    """The leader's appends are out before its log write and its applies; a follower's
    answer is out as soon as its log write is synced. Nothing waits in the links for the
    rest of the event loop's turn."""
    events: list[str] = []
    wires = {name: Wire(events) for name in "ab"}
    hosts = {}
    for name in "ab":
        wal = WriteAheadLog(FileStore(str(tmp_path / name)))
        hosts[name] = RaftHost(name, wal, wires[name], random.Random(ord(name)))
        hosts[name].add_group(1, Recording(events), voters=frozenset("ab"))

    def write_for(name: str) -> Callable[[HostBatch], None]:
        def write(batch: HostBatch) -> None:
            assert batch.wal is not None
            events.append(f"write {name}")
            hosts[name].wal.write(batch.wal)
            hosts[name].wal.sync([batch.wal])
        return write

    def flush(name: str) -> None:
        batch = hosts[name].flush(write_for(name))
        if batch is not None and batch.wal is not None:
            hosts[name].synced(batch)

    def deliver() -> None:
        for name, wire in wires.items():
            out, wire.out = wire.out, []
            for peer, data in out:
                hosts[peer].receive(name, data)

    leader = hosts["a"].core(1)
    for _ in range(200):
        hosts["a"].tick()
        for name in "ab":
            flush(name)
        deliver()
        if leader.role == LEADER and leader.commit >= 1:
            break
    assert leader.role == LEADER
    events.clear()
    hosts["a"].propose(1, b"A", lambda ok: None)
    flush("a")
    assert events == ["sent 1", "write a"]
    deliver()
    events.clear()
    batch = hosts["b"].flush(write_for("b"))
    assert batch is not None and events[-1] == "write b"
    answered = len(wires["b"].out)
    hosts["b"].synced(batch)  # the append's answer, held for the write, leaves with it
    assert events[-1] == "sent 1" and len(wires["b"].out) == answered + 1
    deliver()
    events.clear()
    flush("a")  # committed: the follower is told before the leader applies
    assert events == ["sent 1", "apply A"]


def test_leadership_goes_to_the_most_complete_voter_the_predicate_allows(
        tmp_path: Path) -> None:
    cluster = Cluster("a", "b", "c", "d")
    host = RaftHost("a", WriteAheadLog(FileStore(str(tmp_path))), Nowhere(), random.Random(1))
    cluster.cores["a"] = host.add_group(1, Recording([]), voters=frozenset(cluster.cores))
    leader = cluster.elect("a")
    cluster.down.add("b")
    for i in range(5):
        leader.propose(b"%d" % i)
    cluster.settle()
    refused: set[str] = {"c", "b", "d"}
    host.can_transfer_to = lambda peer: peer not in refused
    assert host.transfer_leadership(1) is None and leader.transferee is None
    refused = {"c"}
    assert host.transfer_leadership(1) == "d"  # b lags behind d
    refused = {"c", "d"}
    assert host.transfer_leadership(1) == "b"  # lagging, but the only one allowed
    assert leader.transferee == "b"


class Chunks(Recording):
    """Gives every chunk it is asked for at once: 10 bytes each, the snapshot 100 long."""

    index = 0

    def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool]:
        return self.index, b"x" * 10, offset == 90

    def install_chunk(self, chunk: SnapshotChunk) -> None:
        self.events.append(f"stored {chunk.offset}")


def sent(wire: Wire) -> list[object]:
    out, wire.out = wire.out, []
    return [decode(data) for _, data in out]


def test_a_window_of_chunks_leaves_with_one_flush(tmp_path: Path) -> None:
    """The flush that asks for a chunk sends as many as the window holds, and the flush
    that takes the follower's answers fills the room they made: one chunk per flush waited
    a turn of the event loop for each."""
    events: list[str] = []
    wire = Wire(events)
    cluster = Cluster("a", "b", "c")
    host = RaftHost("a", WriteAheadLog(FileStore(str(tmp_path))), wire, random.Random(1))
    machine = Chunks(events)
    cluster.cores["a"] = host.add_group(1, machine, voters=frozenset(cluster.cores))
    leader = snapshot_asked_for_c(cluster)
    machine.index = index = leader.commit
    leader.snapshot_ready()
    events.clear()
    host.flush()
    window = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90][:SNAPSHOT_WINDOW]
    assert [m.offset for m in sent(wire) if isinstance(m, InstallSnapshot)] == window
    assert events == [f"sent {len(window)}"]
    for end in (10, 20):  # two answers come in one read
        host.receive("c", encode(SnapshotResponse(1, leader.term, index, end, False)))
    host.flush()
    assert [m.offset for m in sent(wire)] == [window[-1] + 10, window[-1] + 20]


def test_a_stored_chunk_is_answered_in_the_flush_that_stored_it(tmp_path: Path) -> None:
    events: list[str] = []
    wire = Wire(events)
    host = RaftHost("d", WriteAheadLog(FileStore(str(tmp_path))), wire, random.Random(1))
    host.add_group(1, Chunks(events))  # a new replica, waiting to be added

    def flush() -> None:
        batch = host.flush()
        if batch is not None and batch.wal is not None:
            host.wal.write(batch.wal)
            host.wal.sync([batch.wal])
            host.synced(batch)

    for offset in (0, 10):  # (the first one's answer waits for the new term's write)
        host.receive("a", encode(InstallSnapshot(1, 2, 5, 2, Config(frozenset("abc")),
                                                 offset, b"x" * 10, False)))
        flush()
    events.clear()
    sent(wire)
    host.receive("a", encode(InstallSnapshot(1, 2, 5, 2, Config(frozenset("abc")), 20,
                                             b"x" * 10, False)))
    flush()
    assert events == ["stored 20", "sent 1"]
    assert sent(wire) == [SnapshotResponse(1, 2, 5, 30, False)]
