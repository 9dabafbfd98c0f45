"""The node's write-ahead log: one for all its Raft groups, fsync'd once per batch of writes.

Every group's entries, term and vote go to one sequence of segment files, so one
`fdatasync` makes a whole event-loop turn of writes of every group durable (group commit);
with one file per group, 16 groups would need 16 fsyncs per turn.

File format. A segment `<sequence, 16 hex digits>.wal` starts with the 8 bytes `RAFTWAL1`
(the `wal` format's version, broker/formats.py), then records:

    offset  size  field
    0       4     L = body length, unsigned big-endian
    4       4     CRC-32 (zlib.crc32) of the body
    8       4     group id, unsigned big-endian          \
    12      1     kind                                    | body (L bytes)
    13      L-5   payload                                /

    kind 1, entries:    first index (8), then entries as in messages.py (count, then per
                        entry term, kind, length, data). They replace any entry the group
                        had at the first index and after (a follower's truncation).
    kind 2, hard state: term (8), vote length (1), vote (UTF-8; length 0: no vote).
    kind 3, snapshot:   index (8), term (8), configuration (messages.py). The state machine
                        holds the log up to index: entries up to it are dropped; when the log
                        has no entry of that term at index (an installed snapshot), all are.

A new segment starts when the current one passes `segment_bytes`, with a checkpoint: every
group's latest hard state and snapshot marker. So an older segment is only needed for its
entries, and it is deleted once every group with entries in it has compacted past them.

Recovery replays the segments in order. A record cut short or failing its CRC at the end of
the last segment is a write torn by a crash: the file is truncated to the last whole record.
A bad record anywhere else (in an older segment, or followed by whole records) refuses
start-up with `WalCorrupt`, naming the file and offset: skipping it could resurrect a vote
or lose acknowledged entries. Each start opens a new segment, so a torn tail is never
written after.
"""

import errno
import os
import struct
import time
import zlib
from typing import Final, Protocol

from broker.formats import wal_segment_header
from broker.raft.latency import LatencyHistogram
from broker.raft.log import RaftLog
from broker.raft.messages import Config, Entry, MalformedMessage, decode_entries, encode_entries
from broker.raft.ready import HardState, SnapshotMeta

MAGIC: Final = wal_segment_header()  # b"RAFTWAL1" (broker/formats.py)
ENTRIES: Final = 1
HARD_STATE: Final = 2
SNAPSHOT: Final = 3
SUFFIX: Final = ".wal"

_RECORD: Final = struct.Struct(">II")
_BODY_HEAD: Final = struct.Struct(">IB")
_U64: Final = struct.Struct(">Q")
_SNAPSHOT_HEAD: Final = struct.Struct(">QQ")
_HEADER_SIZE: Final = _RECORD.size + _BODY_HEAD.size


class WriteRefused(OSError):
    """A segment write failed for lack of space (ENOSPC, EDQUOT). What it wrote was taken
    back (the file truncated to where the write began), so the batch may be written again
    once there is room (`WriteAheadLog.write` skips the steps it did). Not a failed fsync:
    that one is not retried."""


class WalCorrupt(Exception):
    def __init__(self, name: str, offset: int, reason: str) -> None:
        super().__init__(f"write-ahead log {name}: corrupt record at offset {offset} "
                         f"({reason}); refusing to start")
        self.name = name
        self.offset = offset


class SegmentStore(Protocol):
    """Where segments live: files (FileStore) or, in the simulation, memory that loses
    what was not synced when the simulated node crashes."""

    def names(self) -> list[str]: ...

    def read(self, name: str) -> bytes: ...

    def create(self, name: str) -> None:
        """Makes `name` the segment `write` appends to."""

    def write(self, data: bytes) -> None:
        """Raises WriteRefused, having written nothing of `data`, when there is no space."""

    def sync(self) -> None:
        """Makes what was written to the current segment durable (and its creation)."""

    def truncate(self, name: str, size: int) -> None:
        """Durably."""

    def delete(self, name: str) -> None: ...

    def close(self) -> None: ...


class RecoveredGroup:
    """(Plain classes, as WalBatch: a dataclass costs a start ~0.5 ms to build, issue 42.)"""

    __slots__ = ("gap", "log", "term", "vote")

    def __init__(self) -> None:
        self.term = 0
        self.vote: str | None = None
        self.log = RaftLog()
        self.gap = -1  # entries after a deleted segment wait for a snapshot marker from here


class WalBatch:
    """The writes of one turn, ready to go to disk (`WriteAheadLog.commit`, which may run
    in a worker thread: the batch carries everything it needs)."""

    __slots__ = ("checkpoint", "data", "entries", "new_segment", "obsolete", "step")

    def __init__(self, data: bytes, entries: int) -> None:
        self.data = data
        self.entries = entries
        self.new_segment: str | None = None
        self.checkpoint = b""
        self.obsolete: list[str] = []
        self.step = 0  # of `write`, done: 1 segment created, 2 its checkpoint written, 3 all


class WriteAheadLog:
    def __init__(self, store: SegmentStore, segment_bytes: int = 64 << 20) -> None:
        self.store = store
        self.segment_bytes = segment_bytes
        self._buffer: list[bytes] = []
        self._buffer_entries = 0
        self._buffer_max: dict[int, int] = {}  # group -> last entry index in the buffer
        # Every group's latest hard state and snapshot records (for checkpoints).
        self._hard_states: dict[int, bytes] = {}
        self._snapshots: dict[int, bytes] = {}
        self._snapshot_index: dict[int, int] = {}
        # Segments in order, each with its groups' last entry index.
        self._segments: list[tuple[str, dict[int, int]]] = []
        self._size = 0  # bytes in the current segment
        self._next_segment = 0
        self.bytes_written = 0
        self.syncs = 0
        self.entries_written = 0
        self.last_batch_entries = 0
        self.sync_latency = LatencyHistogram()  # of the fdatasync calls alone

    # --------------------------------------------------------------- recovery

    def recover(self) -> dict[int, RecoveredGroup]:
        """Rebuilds every group's term, vote and log, repairs a torn tail, and prepares a
        new segment for this run's writes (it is created by the first `commit`)."""
        groups: dict[int, RecoveredGroup] = {}
        names = sorted(name for name in self.store.names() if name.endswith(SUFFIX))
        for position, name in enumerate(names):
            last = position == len(names) - 1
            data = self.store.read(name)
            maxima: dict[int, int] = {}
            if len(data) < len(MAGIC) and last:
                self.store.delete(name)
                continue
            if data[:len(MAGIC)] != MAGIC:
                raise WalCorrupt(name, 0, "not a write-ahead log segment")
            end = _replay(data, name, last, groups, maxima)
            if end < len(data):
                self.store.truncate(name, end)
            self._segments.append((name, maxima))
            self._next_segment = int(name[:-len(SUFFIX)], 16) + 1
        for group, state in groups.items():
            if state.gap >= 0:
                raise WalCorrupt(names[-1], 0, f"group {group}'s entries from {state.gap + 1} "
                                 "follow no snapshot marker (a segment is missing)")
            self.hard_state(group, HardState(state.term, state.vote))
            log = state.log
            if log.snapshot_index:
                self.snapshot(group, SnapshotMeta(log.snapshot_index, log.snapshot_term,
                                                  log.snapshot_config))
        self._buffer.clear()
        self._size = self.segment_bytes  # the first commit starts a segment
        return groups

    # ------------------------------------------------------------- appending

    def entries(self, group: int, entries: list[Entry]) -> None:
        if not entries:
            return
        self._record(group, ENTRIES, _U64.pack(entries[0].index) + encode_entries(entries))
        self._buffer_entries += len(entries)
        self._buffer_max[group] = entries[-1].index

    def hard_state(self, group: int, state: HardState) -> None:
        vote = (state.vote or "").encode()
        record = self._record(group, HARD_STATE,
                              _U64.pack(state.term) + bytes((len(vote),)) + vote)
        self._hard_states[group] = record

    def snapshot(self, group: int, meta: SnapshotMeta) -> None:
        record = self._record(group, SNAPSHOT, _SNAPSHOT_HEAD.pack(meta.index, meta.term)
                              + meta.config.encode())
        self._snapshots[group] = record
        self._snapshot_index[group] = meta.index

    def _record(self, group: int, kind: int, payload: bytes) -> bytes:
        head = _BODY_HEAD.pack(group, kind)
        crc = zlib.crc32(payload, zlib.crc32(head))
        record = b"".join((_RECORD.pack(len(head) + len(payload), crc), head, payload))
        self._buffer.append(record)
        return record

    def pending(self) -> bool:
        return bool(self._buffer)

    def take(self) -> WalBatch:
        """The buffered writes as one batch (call `commit` with it)."""
        batch = WalBatch(b"".join(self._buffer), self._buffer_entries)
        self._buffer.clear()
        self._buffer_entries = 0
        if self._size >= self.segment_bytes or not self._segments:
            name = f"{self._next_segment:016x}{SUFFIX}"
            self._next_segment += 1
            batch.new_segment = name
            batch.checkpoint = b"".join((MAGIC, *self._hard_states.values(),
                                         *self._snapshots.values()))
            self._segments.append((name, {}))
            self._size = len(batch.checkpoint)
        self._size += len(batch.data)
        current = self._segments[-1][1]
        current.update(self._buffer_max)
        self._buffer_max.clear()
        # Older segments every group of which has compacted past its entries in them; the
        # markers saying so are in this batch or before it, so durable before the deletion.
        snapshot_index = self._snapshot_index
        while len(self._segments) > 1 and all(
                last <= snapshot_index.get(group, 0)
                for group, last in self._segments[0][1].items()):
            batch.obsolete.append(self._segments.pop(0)[0])
        return batch

    def commit(self, batch: WalBatch) -> None:
        """Writes and fdatasyncs a batch (blocking: the asyncio shell runs it in a thread)."""
        self.write(batch)
        self.sync([batch])

    def write(self, batch: WalBatch) -> None:
        """The write half of `commit`, for a caller that syncs several batches at once. After
        WriteRefused the same batch may be written again: the steps done are not repeated."""
        store = self.store
        if batch.new_segment is not None and batch.step < 1:
            store.sync()  # the previous segment, complete before the next begins
            store.create(batch.new_segment)
            batch.step = 1
        if batch.new_segment is not None and batch.step < 2:
            store.write(batch.checkpoint)
            batch.step = 2
        if batch.step < 3:
            store.write(batch.data)
            batch.step = 3
            self.bytes_written += len(batch.checkpoint) + len(batch.data)

    def sync(self, batches: list[WalBatch]) -> None:
        """Makes written `batches` (and everything written before them) durable with one
        fdatasync, then deletes the segments they made obsolete."""
        started = time.perf_counter()
        self.store.sync()
        self.sync_latency.observe(time.perf_counter() - started)
        entries = 0
        for batch in batches:
            entries += batch.entries
            for name in batch.obsolete:
                self.store.delete(name)
        self.syncs += 1
        self.entries_written += entries
        self.last_batch_entries = entries

    def close(self) -> None:
        self.store.close()

    def segment_names(self) -> list[str]:
        return [name for name, _ in self._segments]


def _replay(data: bytes, name: str, last: bool, groups: dict[int, RecoveredGroup],
            maxima: dict[int, int]) -> int:
    """Applies a segment's records; returns where its whole records end."""
    offset = len(MAGIC)
    size = len(data)
    view = memoryview(data)
    while offset < size:
        reason = _check(data, offset)
        if reason:
            if last and not _whole_records_follow(data, offset):
                return offset  # torn tail
            raise WalCorrupt(name, offset, reason)
        length = _RECORD.unpack_from(data, offset)[0]
        body = offset + _RECORD.size
        group, kind = _BODY_HEAD.unpack_from(data, body)
        state = groups.get(group)
        if state is None:
            state = groups[group] = RecoveredGroup()
        try:
            _apply(state, kind, view[body + _BODY_HEAD.size:body + length], maxima, group)
        except (MalformedMessage, struct.error, UnicodeDecodeError) as exc:
            raise WalCorrupt(name, offset, str(exc)) from None
        offset = body + length
    return offset


def _check(data: bytes, offset: int) -> str:
    if offset + _HEADER_SIZE > len(data):
        return "record header cut short"
    length, crc = _RECORD.unpack_from(data, offset)
    body = offset + _RECORD.size
    if length < _BODY_HEAD.size or body + length > len(data):
        return f"record length {length} runs past the end"
    if zlib.crc32(memoryview(data)[body:body + length]) != crc:
        return "CRC mismatch"
    return ""


def _whole_records_follow(data: bytes, offset: int) -> bool:
    """Whether the bad record at `offset` has a plausible length and whole records follow
    it to the end of the file: then one record was damaged, not the tail torn."""
    length = _RECORD.unpack_from(data, offset)[0] if offset + _RECORD.size <= len(data) else 0
    offset += _RECORD.size + length
    if length < _BODY_HEAD.size or offset >= len(data):
        return False
    while offset < len(data):
        if _check(data, offset):
            return False
        offset += _RECORD.size + _RECORD.unpack_from(data, offset)[0]
    return True


def _apply(state: RecoveredGroup, kind: int, payload: memoryview, maxima: dict[int, int],
           group: int) -> None:
    log = state.log
    if kind == ENTRIES:
        (first,) = _U64.unpack_from(payload, 0)
        entries, end = decode_entries(payload, 8, first)
        if end != len(payload):
            raise MalformedMessage("entries record of the wrong length")
        if first > log.last_index + 1:
            # The entries before it were in a deleted segment: a snapshot marker further on
            # must cover them (checked at the end of recovery).
            log.restore(first - 1, 0, log.config)
            state.gap = first - 1
        if entries:
            maxima[group] = entries[-1].index
        skip = max(0, log.snapshot_index + 1 - first)
        if skip < len(entries):
            log.truncate_after(entries[skip].index - 1)
            for entry in entries[skip:]:
                log.append(entry)
    elif kind == HARD_STATE:
        (state.term,) = _U64.unpack_from(payload, 0)
        length = payload[8]
        if 9 + length != len(payload):
            raise MalformedMessage("bad hard state")
        state.vote = bytes(payload[9:]).decode() or None
    elif kind == SNAPSHOT:
        index, term = _SNAPSHOT_HEAD.unpack_from(payload, 0)
        config = Config.decode(bytes(payload[_SNAPSHOT_HEAD.size:]))
        if index > log.snapshot_index:
            log.restore(index, term, config)
        if index == log.snapshot_index:  # also the base a gap left, which this covers
            log.snapshot_term = term
            log.snapshot_config = config
            state.gap = -1
    else:
        raise MalformedMessage(f"unknown record kind {kind}")


class FileStore:
    """Segments as files in one directory."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self._fd = -1
        self._dir_changed = False

    def names(self) -> list[str]:
        return sorted(os.listdir(self.directory))

    def read(self, name: str) -> bytes:
        with open(os.path.join(self.directory, name), "rb") as file:
            return file.read()

    def create(self, name: str) -> None:
        self.close()
        try:
            self._fd = os.open(os.path.join(self.directory, name),
                               os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise WriteRefused(error.errno, error.strerror, self.directory) from error
        self._dir_changed = True

    def write(self, data: bytes) -> None:
        start = os.lseek(self._fd, 0, os.SEEK_END)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            os.ftruncate(self._fd, start)  # no torn record before the retry's
            raise WriteRefused(error.errno, error.strerror, self.directory) from error

    def sync(self) -> None:
        if self._fd >= 0:
            os.fdatasync(self._fd)
        if self._dir_changed:
            self._sync_directory()

    def truncate(self, name: str, size: int) -> None:
        path = os.path.join(self.directory, name)
        os.truncate(path, size)
        fd = os.open(path, os.O_WRONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, name: str) -> None:
        os.unlink(os.path.join(self.directory, name))
        self._dir_changed = True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _sync_directory(self) -> None:
        self._dir_changed = False
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
