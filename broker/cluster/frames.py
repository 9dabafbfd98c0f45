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


def encode_frame(channel: int, payload: bytes) -> bytes:
    return _HEADER.pack(len(payload) + 1, channel) + payload


class FrameDecoder:
    """Splits a byte stream into frames, keeping an unfinished one for the next feed."""

    __slots__ = ("_buffer", "max_frame")

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame held since the last complete one."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buffer = self._buffer
        buffer += data
        frames: list[tuple[int, bytes]] = []
        offset, end = 0, len(buffer)
        while end - offset >= HEADER_SIZE:
            length, channel = _HEADER.unpack_from(buffer, offset)
            if length == 0 or length > self.max_frame:
                raise FrameError(f"frame length {length} outside 1..{self.max_frame}")
            stop = offset + 4 + length
            if stop > end:
                break
            frames.append((channel, bytes(buffer[offset + HEADER_SIZE:stop])))
            offset = stop
        del buffer[:offset]
        return frames
