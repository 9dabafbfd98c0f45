"""Messages lately read back from the slabs, kept decoded for the next reader of the same.

Why: a thousand durable sessions draining the backlog of one topic read the same stored
messages a thousand times; decoding each value again, and the broker making its own message
of each copy and encoding that as a PUBLISH again, cost more than the rest of a delivery
(profile of bench/durable_bench.py's drain). Kept here, one object per stored message serves
every reader, and what a reader derives from it (the broker's encoded PUBLISH) is shared too.

Bounded: two generations of at most MAX_ENTRIES messages or MAX_BYTES of values each; when
the current one is full it becomes the previous one, and the previous one is dropped. A
message read again while only the previous generation holds it moves to the current one.
What is kept is about twice the values' size (a message's payload, and its PUBLISH once
encoded): at most ~8 MiB, whatever the number of sessions reading.
"""

from typing import Final

from broker.ds.ttv import TTV, Make, decode_value

MAX_ENTRIES: Final = 4096
MAX_BYTES: Final = 2 * 1024 * 1024

Key = tuple[int, bytes]
"""A slab's number (`Slab.uid`, never reused) and the message's master key in it."""


class RecentReads:
    __slots__ = ("_bytes", "_current", "_previous", "hits", "make", "misses")

    def __init__(self, make: Make | None = None) -> None:
        self.make = make
        self._current: dict[Key, TTV] = {}
        self._previous: dict[Key, TTV] = {}
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def decoded(self, slab: int, key: bytes, value: bytes) -> TTV:
        """The message stored under `key` with `value`: the one read before, if still kept."""
        entry = (slab, key)
        ttv = self._current.get(entry)
        if ttv is not None:
            self.hits += 1
            return ttv
        ttv = self._previous.pop(entry, None)
        if ttv is None:
            self.misses += 1
            ttv = decode_value(value, self.make)
        else:
            self.hits += 1
        if len(self._current) >= MAX_ENTRIES or self._bytes >= MAX_BYTES:
            self._previous, self._current, self._bytes = self._current, {}, 0
        self._current[entry] = ttv
        self._bytes += len(value)
        return ttv

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)
