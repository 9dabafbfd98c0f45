"""The commands of Durable Storage's Raft groups (backend `builtin_raft`): their byte format.

One log entry is one command. Replicas apply the same commands in the same order, and every
decision of a write (timestamps, LTS learning, stream assignment, when a generation is full)
is taken while applying, from the command and the replica's state alone (cook.py), so all
replicas hold the same keys without the leader shipping cooked batches:

    command  := kind:u8  body
    STORE    := clock:u64  serial:u64  wlen:u16 writer  count:u32  (length:u32  TTV value)*
                                           messages of one shard, from one writer
    ROTATE   := clock:u64                  seal the current generation if it holds data
    DROP     := cutoff:u64                 drop sealed generations that ended before cutoff
    KV       := serial:u64  prev:u64  wlen:u16 writer  count:u32  (klen:u32 key  vlen:i32 value)*
                                           sessions writes (vlen -1: delete), from one writer
    BARRIER  := (nothing)                  changes nothing: once it is applied here, so is
                                           everything committed before it was proposed
    KV_V1    := wlen:u16 writer  count:u32  (klen:u32 key  vlen:i32 value)*
                                           KV of logs written before chains (kind 4):
                                           applied without the chain's check
    LOAD     := generation:u64  sealed_at:u64  flags:u8  count:u32  (klen:u32 key  vlen:u32 value)*
                                           a generation restored from a backup, its keys as
                                           they are, in chunks: flag 1 its first (the shard
                                           must hold no message), flag 2 its last (then it
                                           is sealed at sealed_at, unless 0: current)

`clock` is the proposing node's clock (microseconds): the cooker's "now". `writer` (a site)
numbers its STOREs per shard (`serial`); a replica skips a STORE whose serial it applied
already: a writer that lost the answer to a forwarded command retries it, and the log may
then hold it twice (Raft's client sessions, dissertation section 6.3). A writer's KV
commands form a chain: `prev` is the serial of its KV command the replicas applied last
when it proposed this one (0: the first since it started), and a replica applies a KV
command only if it follows the last one applied of its writer (replication_shard.py), so
the replicas hold a prefix of each writer's KV commands, never one with a gap: a durable
session's record of what was sent goes out before its commit (session.py), and a later
read position applied without the record before it would skip messages. TTV values are
ttv.py's format with timestamp 0: the cooker sets each one's timestamp in place and stores
it as it is, without decoding it (cook.py, `cook_encoded`). The sessions database admits a
KV command's writes by their `writer` (a node may change only the sessions it owns: see
broker/session/durable/ownership.py). A command that cannot be decoded
is skipped by every replica alike (BadCommand), so the replicas stay the same.
"""

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

from broker.ds.ttv import TTV, encode_value, encoded_topic

STORE: Final = 1
ROTATE: Final = 2
DROP: Final = 3
KV_V1: Final = 4
BARRIER: Final = 5
KV: Final = 6
LOAD: Final = 7
LOAD_FIRST: Final = 1
LOAD_LAST: Final = 2
BARRIER_COMMAND: Final = bytes((BARRIER,))

_U32: Final = struct.Struct(">I")
_I32: Final = struct.Struct(">i")
_KIND_U64: Final = struct.Struct(">BQ")
_STORE_HEAD: Final = struct.Struct(">BQQH")
_KV_HEAD: Final = struct.Struct(">BQQH")
_KV_V1_HEAD: Final = struct.Struct(">BH")
_LOAD_HEAD: Final = struct.Struct(">BQQBI")
_PAIR_HEAD: Final = struct.Struct(">II")

KVWrite = tuple[bytes, bytes | None]  # None deletes


class BadCommand(ValueError):
    pass


class KVCommand(NamedTuple):
    writer: str
    serial: int
    prev: int | None  # None: a KV_V1 command, outside any chain
    writes: list[KVWrite]


class Load(NamedTuple):
    generation: int
    sealed_at: int  # 0: the shard's current generation
    flags: int
    pairs: list[tuple[bytes, bytes]]


class Store(NamedTuple):
    clock: int
    writer: str
    serial: int
    data: bytes  # the command: its values are stored as they are (cook.py, cook_encoded)
    spans: list[int]  # each message's value: its start and end in `data`
    messages: list[TTV] | None  # the messages as objects, on the node that encoded them


def encode_store(clock: int, writer: str, serial: int, messages: Sequence[TTV]) -> bytes:
    name = writer.encode()
    parts = [_STORE_HEAD.pack(STORE, clock, serial, len(name)), name,
             _U32.pack(len(messages))]
    for message in messages:
        value = encode_value(message, 0)
        parts += (_U32.pack(len(value)), value)
    return b"".join(parts)


def encode_rotate(clock: int) -> bytes:
    return _KIND_U64.pack(ROTATE, clock)


def encode_drop(cutoff: int) -> bytes:
    return _KIND_U64.pack(DROP, cutoff)


def encode_kv(writer: str, serial: int, prev: int, writes: Sequence[KVWrite]) -> bytes:
    name = writer.encode()
    parts = [_KV_HEAD.pack(KV, serial, prev, len(name)), name, _U32.pack(len(writes))]
    for key, value in writes:
        parts += (_U32.pack(len(key)), key)
        if value is None:
            parts.append(_I32.pack(-1))
        else:
            parts += (_I32.pack(len(value)), value)
    return b"".join(parts)


def encode_load(generation: int, sealed_at: int, flags: int,
                pairs: Sequence[tuple[bytes, bytes]]) -> bytes:
    parts = [_LOAD_HEAD.pack(LOAD, generation, sealed_at, flags, len(pairs))]
    for key, value in pairs:
        parts += (_PAIR_HEAD.pack(len(key), len(value)), key, value)
    return b"".join(parts)


def decode_load(data: bytes) -> Load:
    try:
        _, generation, sealed_at, flags, count = _LOAD_HEAD.unpack_from(data)
        offset = _LOAD_HEAD.size
        pairs = []
        for _ in range(count):
            klen, vlen = _PAIR_HEAD.unpack_from(data, offset)
            offset += _PAIR_HEAD.size
            pairs.append((data[offset:offset + klen], data[offset + klen:offset + klen + vlen]))
            offset += klen + vlen
    except struct.error as error:
        raise BadCommand(f"LOAD command: {error}") from None
    if offset != len(data):
        raise BadCommand("a LOAD command's pairs do not add up to its length")
    return Load(generation, sealed_at, flags, pairs)


def is_barrier(data: bytes) -> bool:
    return data == BARRIER_COMMAND


def kind_of(data: bytes) -> int:
    if not data:
        raise BadCommand("empty command")
    return data[0]


def decode_clock(data: bytes) -> int:
    """The u64 of a ROTATE or DROP command."""
    if len(data) != _KIND_U64.size:
        raise BadCommand(f"command of {len(data)} bytes, expected {_KIND_U64.size}")
    return int(_KIND_U64.unpack(data)[1])


def decode_store(data: bytes, messages: list[TTV] | None = None) -> Store:
    """The values are located, not decoded: `messages` (this node encoded the command and
    has them) are handed on as they are."""
    try:
        _, clock, serial, wlen = _STORE_HEAD.unpack_from(data)
        offset = _STORE_HEAD.size + wlen
        writer = data[_STORE_HEAD.size:offset].decode()
        (count,) = _U32.unpack_from(data, offset)
        offset += 4
        spans: list[int] = []
        for _ in range(count):
            (length,) = _U32.unpack_from(data, offset)
            offset += 4
            end = offset + length
            if end > len(data):
                raise BadCommand("message past the end of the command")
            if messages is None:  # checked before anything is applied: see cook_encoded
                encoded_topic(data, offset, end).decode()
            spans.append(offset)
            spans.append(end)
            offset = end
    except (struct.error, ValueError, IndexError) as error:
        raise BadCommand(f"STORE command: {error}") from None
    if offset != len(data):
        raise BadCommand("bytes after the last message of a STORE command")
    if messages is not None and len(messages) != count:
        # Not BadCommand: only the proposer has objects, and skipping the command here alone
        # would set its replica apart. The values decide what is stored everywhere.
        messages = None
    return Store(clock, writer, serial, data, spans, messages)


def decode_kv(data: bytes) -> KVCommand:
    try:
        prev: int | None
        if kind_of(data) == KV_V1:
            serial, prev, (_, wlen) = 0, None, _KV_V1_HEAD.unpack_from(data)
            offset = _KV_V1_HEAD.size
        else:
            _, serial, prev, wlen = _KV_HEAD.unpack_from(data)
            offset = _KV_HEAD.size
        writer = data[offset:offset + wlen].decode()
        offset += wlen
        (count,) = _U32.unpack_from(data, offset)
        offset += 4
        writes: list[KVWrite] = []
        for _ in range(count):
            (klen,) = _U32.unpack_from(data, offset)
            key = data[offset + 4:offset + 4 + klen]
            offset += 4 + klen
            (vlen,) = _I32.unpack_from(data, offset)
            offset += 4
            value = None
            if vlen >= 0:
                value = data[offset:offset + vlen]
                offset += vlen
            if offset > len(data) or len(key) != klen:
                raise BadCommand("write past the end of the command")
            writes.append((key, value))
    except (struct.error, UnicodeDecodeError) as error:
        raise BadCommand(f"KV command: {error}") from None
    if offset != len(data):
        raise BadCommand("bytes after the last write of a KV command")
    return KVCommand(writer, serial, prev, writes)
