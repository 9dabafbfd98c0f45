"""Streams and iterators: the read positions a durable session keeps.

An iterator is (stream, topic filter, last timestamp examined). Timestamps only grow within a
shard, so that position alone never misses a later write, and it stays valid across
restarts: `to_bytes` is what a session checkpoints (a few dozen bytes).
"""

import struct
from typing import Final, NamedTuple

_HEAD: Final = struct.Struct(">BHIIQH")
_VERSION: Final = 1


class Stream(NamedTuple):
    """A stream of one slab: (database, shard, generation, LTS stream id)."""

    db: str
    shard: int
    generation: int
    id: int


class Iterator(NamedTuple):
    stream: Stream
    topic_filter: str
    position: int  # the last timestamp examined (microseconds); reads resume after it

    def to_bytes(self) -> bytes:
        db = self.stream.db.encode()
        topic_filter = self.topic_filter.encode()
        s = self.stream
        return (_HEAD.pack(_VERSION, s.shard, s.generation, s.id, self.position, len(db))
                + db + topic_filter)

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Iterator":
        version, shard, generation, stream, position, db_len = _HEAD.unpack_from(raw)
        if version != _VERSION:
            raise ValueError(f"unknown iterator version {version}")
        db = raw[_HEAD.size:_HEAD.size + db_len].decode()
        topic_filter = raw[_HEAD.size + db_len:].decode()
        return cls(Stream(db, shard, generation, stream), topic_filter, position)


class ReadPlan(NamedTuple):
    """How to read a filter from a stream: `fixed` are (varying level ordinal, value) pairs
    the filter pins, answered from the index; `exact` means every topic of the stream
    matches, so topics need no check."""

    fixed: tuple[tuple[int, str], ...]
    exact: bool


def read_plan(structure: tuple[str, ...], topic_filter: str) -> ReadPlan:
    levels = topic_filter.split("/")
    fixed: list[tuple[int, str]] = []
    exact = True
    ordinal = 0
    covered = False
    for depth, level in enumerate(structure):
        wanted = levels[depth] if depth < len(levels) else None
        if wanted == "#":
            # MQTT 4.7.2: a leading wildcard must not match `$` topics the `+` edge may hold
            exact = exact and not (depth == 0 and level == "+")
            covered = True
            break
        if wanted is None:
            return ReadPlan(tuple(fixed), False)
        if level == "+":
            if wanted != "+":
                fixed.append((ordinal, wanted))
                exact = False  # two values may share a hash
            elif depth == 0:
                exact = False
            ordinal += 1
        elif wanted not in ("+", level):
            exact = False
    if not covered and len(levels) != len(structure):
        exact = False
    return ReadPlan(tuple(fixed), exact)
