"""Byte layout of every key in a message slab (one LevelDB directory per shard x generation).

Keys sort by LevelDB's bytewise order, so the layout decides which reads are range scans:

    slab meta:     b"A" | name                                              -> see slab.py
    LTS edge:      b"B" | parent node u32 | level value (UTF-8)             -> child node u32
    data, master:  b"D" | stream u32 | 0x00 | timestamp u64                 -> TTV value
    data, index:   b"D" | stream u32 | level u8 (1..) | hash u64 | timestamp u64 -> b""

All integers are big-endian. `level` in an index key is 1 + the ordinal of a varying
(wildcard) level of the stream's structure; `hash` is the first 8 bytes of BLAKE2b of that
level's value. A master scan of one stream is one contiguous range ordered by time; a filter
that fixes varying levels scans the index ranges of those levels instead and seeks the
master key per hit, so its cost follows the matches and not the stream's size.

Everything that is not data sorts before it. Timestamps only grow, so with few streams per
shard each table LevelDB flushes from its memtable holds keys after every older table's, and
LevelDB moves such a table down the levels without rewriting it. A key sorting after the
data (the counters, when they lived at b"M" and were written with every batch) made every
new table overlap the last one, so each compaction decompressed and rewrote them: writing
1.4M 120-byte messages in batches of 35 took 9.2 s of CPU that way against 5.4 s now. The
Raft checkpoint of a replicated shard goes with the counters for the same reason (shard.py):
written with every batch of 240, it took 2M such writes from 1.8 s of CPU to 5.3 s. With
many streams in a shard, as a fleet of devices makes, tables overlap whatever the layout
and each compaction rewrites them: the slabs' tables are therefore written uncompressed by
default (slab.py, `durable_storage.messages.compression`).
"""

import hashlib
import struct
from typing import Final

META: Final = b"A"
EDGE: Final = b"B"
DATA: Final = b"D"
# After every key of a slab (and of the other databases the node builds: bulk.py), for
# LevelDB's range calls: plyvel gives an omitted end as the empty key, which ends a range
# before every key rather than after them.
PAST_EVERY_KEY: Final = b"\xff" * 64

_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_INDEX_HEAD: Final = struct.Struct(">cIBQ")
_MASTER_HEAD: Final = struct.Struct(">cIB")
TIMESTAMP_SIZE: Final = _U64.size
INDEX_KEY_SIZE: Final = _INDEX_HEAD.size + TIMESTAMP_SIZE
MAX_TIMESTAMP: Final = 2**64 - 1

pack_u32: Final = _U32.pack
pack_u64: Final = _U64.pack
unpack_u32: Final = _U32.unpack
unpack_u64_from: Final = _U64.unpack_from


def level_hash(value: str) -> int:
    """Stable across processes and machines (unlike hash()), so replicas and Spark agree."""
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "big")


def master_prefix(stream: int) -> bytes:
    return _MASTER_HEAD.pack(DATA, stream, 0)


def index_prefix(stream: int, ordinal: int, value_hash: int) -> bytes:
    return _INDEX_HEAD.pack(DATA, stream, ordinal + 1, value_hash)


def timestamp_of(key: bytes) -> int:
    """The timestamp is always the key's last 8 bytes, master or index alike."""
    return unpack_u64_from(key, len(key) - TIMESTAMP_SIZE)[0]


def edge_key(parent: int, level: str) -> bytes:
    return EDGE + pack_u32(parent) + level.encode()


def parse_edge(key: bytes, value: bytes) -> tuple[int, str, int]:
    """(parent, level, child) of an LTS edge record."""
    return unpack_u32(key[1:5])[0], key[5:].decode(), unpack_u32(value)[0]


def meta_key(name: str) -> bytes:
    return META + name.encode()
