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
    __slots__ = ("_dirty", "_reads", "_scheduled", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # the one its connections run on
        self._dirty: list[Flushable] = []
        self._scheduled = False  # a `_flush_later` is coming
        self._reads = 0  # reads being handled (`reading`): each flushes at its end

    def add(self, connection: Flushable) -> None:
        """The connection has output; it is flushed at the end of the current read, or by
        the next loop turn when no read is under way. A read's output schedules no callback
        (a Handle and a Context copy per loop turn that read anything, with a CONNACK, say)."""
        self._dirty.append(connection)
        if not self._scheduled and not self._reads:
            self._scheduled = True
            self.loop.call_soon(self._flush_later)

    def reading(self) -> None:
        """A read is being handled: what it produces is flushed by its `read_done`."""
        self._reads += 1

    def read_done(self) -> None:
        self._reads -= 1
        self.flush()

    def _flush_later(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        dirty = self._dirty
        if dirty:
            self._dirty = []
            for connection in dirty:
                connection.flush()
