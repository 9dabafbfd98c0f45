"""Inter-node frames: what one node sends another over their single link.

Format (every integer big-endian):

    frame   := length:u32  channel:u8  payload
    length  := 1 + len(payload)

One TCP connection per pair of nodes carries every kind of traffic, each on its own
channel, so membership, route updates, forwarded PUBLISHes, Raft and RPC share one socket,
one handshake and one write per event-loop turn (as the client hot path batches its
writes). The decoder is sans-I/O: bytes in, (channel, payload) pairs out; a frame longer
than the limit is refused before it is buffered, so a garbled length cannot make a node
allocate gigabytes.
"""

import struct
from enum import IntEnum
from typing import Final

_HEADER: Final = struct.Struct(">IB")
HEADER_SIZE: Final = _HEADER.size


class Channel(IntEnum):
    HANDSHAKE = 0
    MEMBERSHIP = 1
    ROUTES = 2
    FORWARD = 3
    RAFT = 4
    RPC = 5
    HEARTBEAT = 6


class FrameError(ValueError):
    """The byte stream is not a sequence of valid frames: the link must be closed."""


def frame_head(channel: int, size: int) -> bytes:
    """The header of a frame whose payload is `size` bytes."""
    return _HEADER.pack(size + 1, channel)


def encode_frame(channel: int, payload: bytes) -> bytes:
    return frame_head(channel, len(payload)) + payload


class FrameDecoder:
    """Splits a byte stream into frames, keeping an unfinished one for the next feed. A
    frame's payload is copied once: sliced from the read that holds it whole, or joined
    from views of the reads it spans (a snapshot chunk's MiB comes in reads of 256 KiB;
    appending them to a buffer, then slicing the frame out of it and that into bytes,
    copied it three times)."""

    __slots__ = ("_channel", "_head", "_held", "_missing", "_parts", "max_frame")

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._head = b""  # the start of a frame's header a read cut
        self._parts: list[memoryview] = []  # the payload so far of the frame a read cut
        self._held = 0  # bytes in `_parts`
        self._missing = 0  # bytes of that payload still to come
        self._channel = 0  # that frame's

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame held since the last complete one."""
        return len(self._head) + (HEADER_SIZE + self._held if self._parts else 0)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        frames: list[tuple[int, bytes]] = []
        at = 0
        if self._parts:
            at = min(self._missing, len(data))
            self._parts.append(memoryview(data)[:at])
            self._held += at
            self._missing -= at
            if self._missing:
                return frames
            frames.append((self._channel, b"".join(self._parts)))
            self._parts, self._held = [], 0
        elif self._head:
            data = self._head + data  # (a read ending inside a header: rare)
            self._head = b""
        size = len(data)
        while size - at >= HEADER_SIZE:
            length, channel = _HEADER.unpack_from(data, at)
            if length == 0 or length > self.max_frame:
                raise FrameError(f"frame length {length} outside 1..{self.max_frame}")
            start = at + HEADER_SIZE
            stop = at + 4 + length
            if stop > size:
                self._parts = [memoryview(data)[start:]]
                self._held = size - start
                self._missing = stop - size
                self._channel = channel
                return frames
            frames.append((channel, data[start:stop]))
            at = stop
        if at < size:
            self._head = data[at:]
        return frames
