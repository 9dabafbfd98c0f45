"""Retained messages as the state machine of the metadata Raft group.

Every node applies the committed entries to its own RetainedStore, so a new subscriber on
any node reads its node's copy (cheap, not linearizable: a node that lags sees an older
value for a moment). An entry carries a batch of retained messages, as the proposing node
admitted them (default lifetime fixed there, so every replica stores the same deadline):

    entry    := count:u32  command*
    command  := kind:u8  length:u32  record        kind 1: set (empty payload: clear)
    record   := broker/retainer/store.py's record
    version  := count:u32 = 1  kind:u8 = 2  length:u32 = 4  cluster_version:u32

A `version` entry raises the cluster's effective version (broker/cluster/versions.py);
it is proposed alone, only once every member runs code that applies it (release 0.1.0
reads kind 2 as a bad command and skips the entry). The version never falls: an entry
below the current one changes nothing.

A snapshot is the store's content at the applied index, `count:u32` then per topic
`length:u32 topic length:u32 record`, cut into chunks by offset. It moves through files on
both nodes, dumped on a worker thread from a LevelDB snapshot of the store
(broker/raft/spool.py), and is installed into a new database swapped in whole
(RetainedStore.replace): the metadata group's leader must not stop its event loop to read a
large retained set, nor either node hold a second copy of it in memory.
"""

import concurrent.futures
import logging
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Final

import plyvel  # type: ignore[import-untyped]

from broker.raft.host import ApplyFailed
from broker.raft.messages import NORMAL, Config, Entry
from broker.raft.ready import SnapshotChunk, SnapshotMeta
from broker.raft.spool import FILE_BUFFER, DumpStopped, DumpWriter, SnapshotSpool, Splice
from broker.retainer.store import CLUSTER_VERSION_KEY, RetainedStore, decode_record
from broker.session.message import Message

log = logging.getLogger(__name__)

SET: Final = 1
VERSION: Final = 2
_U32: Final = struct.Struct(">I")
_COMMAND: Final = struct.Struct(">BI")
_VERSION_ENTRY: Final = struct.Struct(">IBII")
_dumps: concurrent.futures.ThreadPoolExecutor | None = None


class BadCommand(ValueError):
    pass


def encode_commands(records: list[bytes]) -> bytes:
    parts = [_U32.pack(len(records))]
    for record in records:
        parts.append(_COMMAND.pack(SET, len(record)))
        parts.append(record)
    return b"".join(parts)


def encode_version(cluster_version: int) -> bytes:
    return _VERSION_ENTRY.pack(1, VERSION, _U32.size, cluster_version)


def decode_version(data: bytes) -> int | None:
    """The cluster version a `version` entry sets; None for any other entry."""
    if len(data) != _VERSION_ENTRY.size:
        return None
    count, kind, length, cluster_version = _VERSION_ENTRY.unpack(data)
    return cluster_version if (count, kind, length) == (1, VERSION, _U32.size) else None


def decode_commands(data: bytes) -> list[tuple[Message, bytes]]:
    """The commands' messages, each with its record (what the store keeps)."""
    try:
        (count,) = _U32.unpack_from(data)
        offset = _U32.size
        messages = []
        for _ in range(count):
            kind, length = _COMMAND.unpack_from(data, offset)
            offset += _COMMAND.size
            if kind != SET or offset + length > len(data):
                raise BadCommand(f"command kind {kind}, length {length}")
            record = data[offset:offset + length]
            messages.append((decode_record(record), record))
            offset += length
    except (struct.error, ValueError) as error:
        raise BadCommand(f"garbled retained command: {error}") from None
    if offset != len(data):
        raise BadCommand("trailing bytes after the retained commands")
    return messages


def _write_snapshot(file: IO[bytes], stop: threading.Event, items: Any) -> None:
    """The records of a LevelDB iterator over the store; the count, unknown until the end,
    is written over the placeholder at the start."""
    count = 0
    file.write(_U32.pack(0))
    try:
        for key, record in items:
            if not count % 1024 and stop.is_set():
                raise DumpStopped
            # Markers (RetainedStore) are no topics, but the cluster version goes along.
            if not key.startswith(b"\x00") or key == CLUSTER_VERSION_KEY:
                file.write(_U32.pack(len(key)) + key + _U32.pack(len(record)) + record)
                count += 1
    finally:
        items.close()
    end = file.tell()
    file.seek(0)
    file.write(_U32.pack(count))
    file.seek(end)


def _read_snapshot(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """The (topic, record) pairs of a snapshot file, read as they are consumed."""
    with path.open("rb", buffering=FILE_BUFFER) as file:
        (count,) = _U32.unpack(_read(file, _U32.size))
        for _ in range(count):
            key = _read(file, _U32.unpack(_read(file, _U32.size))[0])
            yield key, _read(file, _U32.unpack(_read(file, _U32.size))[0])
        if file.read(1):
            raise BadCommand("bytes after the last record of a retained snapshot")


def _read(file: IO[bytes], size: int) -> bytes:
    data = file.read(size)
    if len(data) < size:
        raise BadCommand("a retained snapshot cut short")
    return data


def _executor() -> concurrent.futures.Executor:
    """The thread the metadata group's snapshots are dumped on (made at the first)."""
    global _dumps
    if _dumps is None:
        _dumps = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="retained-dump")
    return _dumps


class RetainedMachine:
    """The StateMachine (broker/raft/host.py) of the metadata group over a RetainedStore."""

    def __init__(self, store: RetainedStore, refused: Callable[[int], None]) -> None:
        self.store = store
        self._refused = refused
        self.applied_index, self.applied_term = store.applied()
        self.cluster_version = store.cluster_version()  # the effective one, never falls
        # Applied and made durable by `flush`: the log may be truncated up to here. What
        # LevelDB recovered at start is not known to be synced, hence 0.
        self.flushed_index = 0
        self.unflushed_bytes = 0  # command bytes applied since the last flush
        self.bad_commands = 0
        self.spool = SnapshotSpool(store.path, "the retained messages", _executor,
                                   self._start_dump)
        # The entry this node proposed as the leader, with its messages: applied without
        # decoding what it has just encoded (the log hands back the very same bytes).
        self._proposed: tuple[bytes, list[tuple[Message, bytes]]] | None = None

    def unlogged(self) -> bool:
        """Retained messages stored before the node had a Raft group (no position)."""
        return self.applied_index == 0 and len(self.store) > 0

    def snapshot(self) -> SnapshotMeta | None:
        """The last snapshot installed, for the core after a restart (see RaftGroup)."""
        installed = self.store.installed_snapshot()
        if installed is None:
            return None
        index, term, config = installed
        return SnapshotMeta(index, term, Config.decode(config))

    def proposing(self, data: bytes, messages: list[tuple[Message, bytes]]) -> None:
        """This node, leading, proposes `data`: the encoding of `messages` (and records)."""
        self._proposed = (data, messages)

    # ---- StateMachine ----------------------------------------------------------------------
    def apply(self, entry: Entry) -> None:
        if entry.kind == NORMAL:
            self.unflushed_bytes += len(entry.data)
            proposed = self._proposed
            version = decode_version(entry.data)
            if proposed is not None and proposed[0] is entry.data:
                messages = proposed[1]
                self._proposed = None
            elif version is not None:
                messages = []
                version = self.cluster_version = max(version, self.cluster_version)
            else:
                messages = self._decode(entry.data)
            try:
                refused = self.store.write(messages, entry.index, entry.term, version)
            except (plyvel.Error, OSError) as error:  # the store: `rewind`, then again
                raise ApplyFailed(f"retained messages: entry {entry.index}: {error}",
                                  error) from error
            if refused:
                self._refused(refused)
        self.applied_index, self.applied_term = entry.index, entry.term

    def rewind(self) -> int:
        """Blocking: the store reopened and read back (RetainedStore.reload), at the index
        its data reflects (each applied entry's write carries it)."""
        self.store.reload()
        self.applied_index, self.applied_term = self.store.applied()
        self.flushed_index = min(self.flushed_index, self.applied_index)
        self._proposed = None
        return self.applied_index

    def _decode(self, data: bytes) -> list[tuple[Message, bytes]]:
        try:
            return decode_commands(data)
        except BadCommand:
            # Every replica skips it alike: the log stays the same on all of them.
            self.bad_commands += 1
            return []

    def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool] | None:
        return self.spool.chunk(self.applied_index, index, offset)

    def install_chunk(self, chunk: SnapshotChunk) -> None:
        try:
            installed = self.spool.receive(chunk, lambda path: self._install(path, chunk))
        except (plyvel.Error, OSError) as failure:  # kept as it was: the transfer starts over
            raise ApplyFailed(f"retained messages: snapshot {chunk.index} at offset"
                              f" {chunk.offset}: {failure}", failure) from failure
        if installed:
            self.applied_index, self.applied_term = chunk.index, chunk.term
            self.flushed_index = chunk.index
            # The snapshot's, if higher: one taken before this node applied a version entry
            # it holds (the log after it goes on from there) cannot lower it.
            self.cluster_version = max(self.cluster_version, self.store.cluster_version())

    def _start_dump(self) -> tuple[DumpWriter, Callable[[], None]]:
        view = self.store.view()

        def write(file: IO[bytes], stop: threading.Event, _splice: Splice) -> None:
            _write_snapshot(file, stop, view.iterator())

        return write, view.close

    def _install(self, path: Path, chunk: SnapshotChunk) -> None:
        self.store.replace(_read_snapshot(path), chunk.index, chunk.term,
                           chunk.config.encode())
        log.info("retained messages replaced by a snapshot at index %d", chunk.index)

    # ---- durability ---------------------------------------------------------------------
    def flush(self) -> int:
        """Makes the applied data durable; returns the index the log may be compacted to."""
        if self.flushed_index < self.applied_index:
            self.store.flush(self.applied_index, self.applied_term)
            self.flushed_index = self.applied_index
        self.unflushed_bytes = 0
        self.spool.drop_idle()
        return min([self.flushed_index, *self.spool.kept()])
