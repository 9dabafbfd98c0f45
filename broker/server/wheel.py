"""The connections' deadlines (CONNECT in time, keep-alive) on one event-loop timer.

A `loop.call_later` per connection costs ~250 bytes while it waits: the TimerHandle, the
Context it copies, the bound method and its arguments; and a cancelled one stays in the
loop's heap until its time comes (every connection's CONNECT deadline, cancelled by its
CONNECT). Here a connection due at time T is filed under slot ceil(T / RESOLUTION), one
loop timer is armed for the earliest slot, and when it fires every connection of every slot
that has come is told (`timer_due`), at most RESOLUTION late.
"""

import asyncio
import math
import weakref
from time import monotonic  # the loop's clock, without a Python call (connection.py)
from typing import Final, Protocol

RESOLUTION: Final = 0.25  # seconds


class Due(Protocol):
    def timer_due(self) -> None: ...


class Wheel:
    __slots__ = ("_armed", "_handle", "_loop", "_slots")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # Per slot its owners, in a dict (~40 bytes an entry, a set takes twice that).
        self._slots: dict[int, dict[Due, None]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._armed = 0  # the slot the handle fires for

    def add(self, owner: Due, delay: float) -> int:
        """`owner.timer_due()` in `delay` seconds (up to RESOLUTION later); returns the slot,
        for `discard`."""
        slot = math.ceil((monotonic() + delay) / RESOLUTION)
        bucket = self._slots.get(slot)
        if bucket is None:
            bucket = self._slots[slot] = {}
        bucket[owner] = None
        if self._handle is None or slot < self._armed:
            self._arm(slot)
        return slot

    def discard(self, owner: Due, slot: int) -> None:
        bucket = self._slots.get(slot)
        if bucket is not None:
            bucket.pop(owner, None)
            if not bucket:
                del self._slots[slot]  # the timer may still fire for it: it finds nothing

    def _arm(self, slot: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed = slot
        self._handle = self._loop.call_at(slot * RESOLUTION, self._fire)

    def _fire(self) -> None:
        self._handle = None
        # call_at may run a callback up to the clock's resolution early: a slot counts as
        # come from a microsecond before its time.
        now = math.floor((monotonic() + 1e-6) / RESOLUTION)
        for slot in sorted(s for s in self._slots if s <= now):
            for owner in self._slots.pop(slot):
                owner.timer_due()
        if self._slots and self._handle is None:
            self._arm(min(self._slots))


_WHEELS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Wheel]" = (
    weakref.WeakKeyDictionary())
_last: Wheel | None = None  # the one found last: a node runs one loop


def wheel(loop: asyncio.AbstractEventLoop | None = None) -> Wheel:
    """The wheel of `loop`, by default the running one's (asking costs a getpid: a
    connection, which knows its loop, passes it, three times per connection)."""
    global _last
    if loop is None:
        loop = asyncio.get_running_loop()
    last = _last
    if last is not None and last._loop is loop:
        return last
    found = _WHEELS.get(loop)
    if found is None:
        found = _WHEELS[loop] = Wheel(loop)
    _last = found
    return found
