"""Acknowledgements that wait for storage, in the order they must leave.

A PUBACK/PUBREC for a stored message waits for the disk, and acknowledgements leave in the
order their PUBLISHes came (MQTT-4.6.0-2), so one that needs nothing still waits behind one
that waits. What waits is counted, with the payload bytes storage holds for it meanwhile:
at `mqtt.max_awaiting_storage(_bytes)` the connection stops reading the client until
storage catches up (connection.py), so a client that ignores flow control cannot grow the
broker.
"""

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final

from broker.mqtt.constants import FIRST_FAILURE_CODE, PUBACK_BYTE, PUBCOMP_BYTE, PUBREC_BYTE


def returns_quota(ack: bytes) -> bool:
    """A PUBACK, a PUBCOMP or a PUBREC with an error code: the acknowledgement that gives a
    client back one unit of its send quota (MQTT 5.0 section 4.9)."""
    b0 = ack[0]
    return b0 in (PUBACK_BYTE, PUBCOMP_BYTE) or (
        b0 == PUBREC_BYTE and len(ack) > 4 and ack[4] >= FIRST_FAILURE_CODE)


class _Waiting:
    """Acknowledgements that wait for one storage future (or behind ones that wait), with
    the payload bytes of their PUBLISHes, which storage holds meanwhile."""

    __slots__ = ("future", "packets", "size")

    def __init__(self, future: "asyncio.Future[Any] | None", packet: bytes, size: int) -> None:
        self.future = future
        self.packets = [packet]
        self.size = size


NOTHING: Final[list[bytes]] = []


class AckOrder:
    """A connection's waiting acknowledgements, grouped by the future they wait for."""

    __slots__ = ("_groups", "_max_bytes", "_max_count", "count", "size")

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self._groups: deque[_Waiting] = deque()
        self._max_count = max_count
        self._max_bytes = max_bytes
        self.count = 0  # acknowledgements waiting
        self.size = 0  # their PUBLISHes' payload bytes

    @property
    def waiting(self) -> bool:
        return bool(self._groups)

    def add(self, durable: Awaitable[Any] | None, data: bytes, size: int,
            on_done: Callable[[object], None]) -> bool:
        """Queues `data` behind the others, to leave once `durable` is done (`on_done` is
        called then); True once the bounds are reached."""
        self.count += 1
        self.size += size
        groups = self._groups
        if groups and groups[-1].future is durable:
            # PUBLISHes of one read share their storage future: one group, one callback.
            group = groups[-1]
            group.packets.append(data)
            group.size += size
        else:
            future = (durable if durable is None or isinstance(durable, asyncio.Future)
                      else asyncio.ensure_future(durable))
            groups.append(_Waiting(future, data, size))
            if future is not None:
                future.add_done_callback(on_done)
        return self.count >= self._max_count or self.size >= self._max_bytes

    def ready(self) -> "tuple[list[bytes], asyncio.Future[Any] | None]":
        """The acknowledgements free to leave now, in order; and the storage future that
        failed, if one did: then nothing after it may leave (not durable, so not
        acknowledged: the client resends after reconnecting), and all is dropped."""
        groups = self._groups
        out = NOTHING
        while groups:
            group = groups[0]
            future = group.future
            if future is not None and not future.done():
                break
            groups.popleft()
            self.count -= len(group.packets)
            self.size -= group.size
            if future is not None and (future.cancelled() or future.exception() is not None):
                groups.clear()
                self.count = self.size = 0
                return out, future
            out = group.packets if out is NOTHING else out + group.packets
        return out, None

    def below_half(self) -> bool:
        """Reading resumes at half the bounds, not just under them: one pause per storage
        flush or so, rather than one per acknowledgement."""
        return self.count * 2 <= self._max_count and self.size * 2 <= self._max_bytes
