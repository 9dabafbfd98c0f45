"""Retained messages as the state machine of the metadata Raft group.

Every node applies the committed entries to its own RetainedStore, so a new subscriber on
any node reads its node's copy (cheap, not linearizable: a node that lags sees an older
value for a moment). An entry carries a batch of retained messages, as the proposing node
admitted them (default lifetime fixed there, so every replica stores the same deadline):

    entry    := count:u32  command*
    command  := kind:u8  length:u32  record        kind 1: set (empty payload: clear)
    record   := broker/retainer/store.py's record

A snapshot is the store's content at the applied index, `count:u32` then per topic
`length:u32 topic length:u32 record`, cut into chunks by offset. The snapshot being sent is
kept in memory until another is asked for (the retained set is small next to the message
store; sending it from a LevelDB snapshot in pieces is left for when it is not).
"""

import struct
from collections.abc import Callable
from typing import Final

from broker.raft.messages import NORMAL, Config, Entry
from broker.raft.ready import SnapshotChunk, SnapshotMeta
from broker.retainer.store import RetainedStore, decode_record
from broker.session.message import Message

SET: Final = 1
CHUNK_BYTES: Final = 256 << 10
_U32: Final = struct.Struct(">I")
_COMMAND: Final = struct.Struct(">BI")


class BadCommand(ValueError):
    pass


def encode_commands(records: list[bytes]) -> bytes:
    parts = [_U32.pack(len(records))]
    for record in records:
        parts.append(_COMMAND.pack(SET, len(record)))
        parts.append(record)
    return b"".join(parts)


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


def encode_snapshot(records: list[tuple[bytes, bytes]]) -> bytes:
    parts = [_U32.pack(len(records))]
    for key, record in records:
        parts += (_U32.pack(len(key)), key, _U32.pack(len(record)), record)
    return b"".join(parts)


def decode_snapshot(data: bytes) -> list[tuple[bytes, bytes]]:
    (count,) = _U32.unpack_from(data)
    offset = _U32.size
    records = []
    for _ in range(count):
        (length,) = _U32.unpack_from(data, offset)
        key = data[offset + 4:offset + 4 + length]
        offset += 4 + length
        (length,) = _U32.unpack_from(data, offset)
        records.append((key, data[offset + 4:offset + 4 + length]))
        offset += 4 + length
    return records


class RetainedMachine:
    """The StateMachine (broker/raft/host.py) of the metadata group over a RetainedStore."""

    def __init__(self, store: RetainedStore, refused: Callable[[int], None]) -> None:
        self.store = store
        self._refused = refused
        self.applied_index, self.applied_term = store.applied()
        # Applied and made durable by `flush`: the log may be truncated up to here. What
        # LevelDB recovered at start is not known to be synced, hence 0.
        self.flushed_index = 0
        self.unflushed_bytes = 0  # command bytes applied since the last flush
        self.bad_commands = 0
        self._outgoing: tuple[int, bytes] | None = None  # the snapshot being sent
        # The entry this node proposed as the leader, with its messages: applied without
        # decoding what it has just encoded (the log hands back the very same bytes).
        self._proposed: tuple[bytes, list[tuple[Message, bytes]]] | None = None
        self._incoming = bytearray()

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
            if proposed is not None and proposed[0] is entry.data:
                messages = proposed[1]
                self._proposed = None
            else:
                messages = self._decode(entry.data)
            refused = self.store.write(messages, entry.index, entry.term)
            if refused:
                self._refused(refused)
        self.applied_index, self.applied_term = entry.index, entry.term

    def _decode(self, data: bytes) -> list[tuple[Message, bytes]]:
        try:
            return decode_commands(data)
        except BadCommand:
            # Every replica skips it alike: the log stays the same on all of them.
            self.bad_commands += 1
            return []

    def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool]:
        outgoing = self._outgoing
        if outgoing is None or (index or self.applied_index) != outgoing[0]:
            # A new one (or one asked for that is no longer kept: the core starts over).
            outgoing = self._outgoing = (self.applied_index,
                                         encode_snapshot(self.store.records()))
            offset = 0
        at, data = outgoing
        end = offset + CHUNK_BYTES
        return at, data[offset:end], end >= len(data)

    def install_chunk(self, chunk: SnapshotChunk) -> None:
        if chunk.offset == 0:  # (the core hands chunks over in order, from 0)
            self._incoming = bytearray()
        self._incoming += chunk.data
        if not chunk.done:
            return
        records = decode_snapshot(bytes(self._incoming))
        self._incoming = bytearray()
        self.store.replace(records, chunk.index, chunk.term, chunk.config.encode())
        self.applied_index, self.applied_term = chunk.index, chunk.term
        self.flushed_index = chunk.index

    # ---- durability ---------------------------------------------------------------------
    def flush(self) -> int:
        """Makes the applied data durable; returns the index the log may be compacted to."""
        if self.flushed_index < self.applied_index:
            self.store.flush(self.applied_index, self.applied_term)
            self.flushed_index = self.applied_index
        self.unflushed_bytes = 0
        return self.flushed_index
