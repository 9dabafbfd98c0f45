"""A state machine whose storage refuses a write (ApplyFailed): the host stalls the group on
that entry instead of losing it, keeps later entries and the proposals waiting on them, and
`retry` rewinds the machine to what its storage holds and applies again from there, in order.
Any other exception from `apply` is a bug and still propagates."""

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.raft.core import LEADER
from broker.raft.host import ApplyFailed, HostBatch, RaftHost
from broker.raft.messages import NORMAL, Entry
from broker.raft.ready import SnapshotChunk
from broker.raft.wal import FileStore, WriteAheadLog
from tests.raft.test_host import Nowhere


class Storage:
    """What a machine's storage holds: (index, data) in order, written only while it has
    room; `rewind` reads back the last index it holds."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, bytes]] = []
        self.full = False
        self.bug: Exception | None = None
        self.rewinds = 0

    def apply(self, entry: Entry) -> None:
        if self.bug is not None:
            raise self.bug
        if self.full:
            full = OSError(28, "No space left")
            raise ApplyFailed(f"entry {entry.index}", full) from full
        if entry.kind == NORMAL:
            self.rows.append((entry.index, entry.data))

    def rewind(self) -> int:
        if self.full:
            raise OSError(28, "still no space")
        self.rewinds += 1
        # As a shard at a restart: it resumes at an earlier checkpoint than its last write.
        self.rows = self.rows[:1]
        return self.rows[0][0]

    def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool]:
        raise AssertionError("no compaction in this test")

    def install_chunk(self, chunk: SnapshotChunk) -> None:
        raise AssertionError("no compaction in this test")


def _leader(tmp_path: Path, machine: Storage) -> tuple[RaftHost, Callable[[], None]]:
    """A single-voter group led by `machine`'s host, and the flush that drives it."""
    wal = WriteAheadLog(FileStore(str(tmp_path)))
    host = RaftHost("a", wal, Nowhere(), random.Random(7))
    core = host.add_group(1, machine, voters=frozenset({"a"}))

    def commit(batch: HostBatch) -> None:
        assert batch.wal is not None
        wal.commit(batch.wal)

    def flush() -> None:
        """Until nothing is left: each batch written, synced and released at once."""
        while host.has_ready():
            batch = host.flush(commit)
            if batch is not None and batch.wal is not None:
                host.synced(batch)

    ticks = 0
    while core.role != LEADER:
        ticks += 1
        assert ticks < 100, "no leader"
        host.tick()
        flush()
    flush()
    return host, flush


def test_a_refused_apply_stalls_the_group_until_a_retry_rewinds_it(tmp_path: Path) -> None:
    machine = Storage()
    host, flush = _leader(tmp_path, machine)
    done: dict[bytes, bool] = {}

    def propose(data: bytes) -> None:
        host.propose(1, data, lambda ok: done.__setitem__(data, ok))

    for data in (b"A", b"B"):
        propose(data)
    flush()
    assert [row[1] for row in machine.rows] == [b"A", b"B"]
    machine.full = True
    for data in (b"C", b"D"):
        propose(data)
    flush()
    assert host.stalled and [row[1] for row in machine.rows] == [b"A", b"B"]
    assert list(done) == [b"A", b"B"]  # C and D committed, not applied: not settled
    assert isinstance(host.apply_errors[0][1], OSError)
    propose(b"E")
    flush()
    host.retry()  # still full: the rewind fails, the group stays stalled
    assert host.stalled and machine.rewinds == 0
    machine.full = False
    host.retry()
    flush()
    assert not host.stalled and machine.rewinds == 1
    assert [row[1] for row in machine.rows] == [b"A", b"B", b"C", b"D", b"E"]
    assert done == {b"A": True, b"B": True, b"C": True, b"D": True, b"E": True}
    assert host.core(1).applied_index == machine.rows[-1][0]


def test_any_other_exception_from_apply_propagates(tmp_path: Path) -> None:
    machine = Storage()
    host, flush = _leader(tmp_path, machine)
    machine.bug = ValueError("a bug, not a full disk")
    host.propose(1, b"A", lambda ok: None)
    with pytest.raises(ValueError, match="a bug"):
        flush()
