"""The host's flush on a real write-ahead log: the order of the log write and the apply."""

import random
from pathlib import Path

from broker.raft.core import LEADER
from broker.raft.host import HostBatch, RaftHost
from broker.raft.messages import NORMAL, Entry
from broker.raft.ready import SnapshotChunk
from broker.raft.wal import FileStore, WriteAheadLog


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
