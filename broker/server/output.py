"""Collects which connections have output waiting and writes it once per socket read.

A read from one client (a burst of PUBLISHes, or a batch of PUBACKs) produces output for
other clients. Writing it at the end of that read, rather than on a later event-loop turn,
keeps the round trip short for QoS 1/2 windows: a subscriber's PUBACKs open its window, and
the next messages are on the wire before the loop turns to another socket's large read. It
is still one write per destination per read, never one per message. Output produced outside
a read (timers, will messages, the HTTP API) is flushed by one scheduled callback.
"""

import asyncio
from typing import Protocol


class Flushable(Protocol):
    def flush(self) -> None: ...


class OutputBatch:
    __slots__ = ("_dirty", "_scheduled", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # the one its connections run on
        self._dirty: list[Flushable] = []
        self._scheduled = False  # a `_flush_later` is coming

    def add(self, connection: Flushable) -> None:
        """The connection has output; it is flushed at the end of the current read, or by
        the next loop turn when no read is under way. One callback for a turn's reads, not
        one per read: a read's own `flush` leaves the callback scheduled."""
        self._dirty.append(connection)
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush_later)

    def _flush_later(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        dirty = self._dirty
        if dirty:
            self._dirty = []
            for connection in dirty:
                connection.flush()
