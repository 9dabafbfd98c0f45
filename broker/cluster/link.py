"""One authenticated connection to another node: handshake, then framed channels.

A thin asyncio shell over the sans-I/O `Handshake` and `FrameDecoder`. Everything a node
sends a peer in one event-loop turn (route updates, forwarded PUBLISHes, Raft messages, RPC)
leaves in one write, as the client hot path does, unless the sender flushes sooner (Raft
flushes its messages with each of its flushes: see raft/host.py's Transport). What arrives
is handed to the owner by channel; anything that is not a valid frame closes the link with
a log line, never raises.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Final, Protocol, cast

from broker.cluster.frames import Channel, FrameDecoder, FrameError, encode_frame, frame_head
from broker.cluster.handshake import Handshake, Identity, Refused, Role

log = logging.getLogger(__name__)

# A frame larger than this closes the link: forwarded batches and Raft entries are split
# well below it; snapshots travel in chunks.
MAX_FRAME: Final = 64 * 1024 * 1024
_HIGH_WATER: Final = 16 * 1024 * 1024


class LinkOwner(Protocol):
    """What a link reports to: the cluster service."""

    def handshake_for(self, role: Role) -> Handshake: ...
    def link_up(self, link: "PeerLink") -> bool: ...
    def link_lost(self, link: "PeerLink") -> None: ...
    def link_refused(self, link: "PeerLink", error: Refused) -> None: ...
    def frame(self, link: "PeerLink", channel: int, payload: bytes) -> None: ...


class PeerLink(asyncio.Protocol):
    def __init__(self, owner: LinkOwner, role: Role, clock: Callable[[], float]) -> None:
        self.owner = owner
        self.role = role
        self.handshake = owner.handshake_for(role)
        self.peer: Identity | None = None
        self.established = False
        self.closed = False
        self.closed_by_peer = False  # (EOF or reset) rather than by this node
        self.last_rx = clock()
        self.bytes_sent = 0
        self.bytes_received = 0
        self._clock = clock
        self._decoder = FrameDecoder(MAX_FRAME)
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False

    # ---- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        transport.set_write_buffer_limits(high=_HIGH_WATER)
        self._transport = transport
        if self.role is Role.DIALER:
            self._write(Channel.HANDSHAKE, self.handshake.start())

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_rx = self._clock()
        self.bytes_received += len(data)
        try:
            frames = self._decoder.feed(data)
        except FrameError as error:
            self._garbled(str(error))
            return
        for channel, payload in frames:
            if self.closed:
                return
            if not self.established:
                self._handshake(channel, payload)
            elif channel != Channel.HEARTBEAT:
                self.owner.frame(self, channel, payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed_by_peer = not self.closed
        self.closed = True
        self.owner.link_lost(self)

    # ---- handshake -----------------------------------------------------------------------
    def _handshake(self, channel: int, payload: bytes) -> None:
        if channel != Channel.HANDSHAKE:
            self._garbled(f"channel {channel} before the handshake finished")
            return
        try:
            replies = self.handshake.receive(payload)
        except Refused as error:
            self._write(Channel.HANDSHAKE, Handshake.refusal(error))
            self.owner.link_refused(self, error)
            self.close()
            return
        for reply in replies:
            self._write(Channel.HANDSHAKE, reply)
        if self.handshake.done:
            self.peer = self.handshake.peer
            self.established = True
            if not self.owner.link_up(self):
                self.close()

    def _garbled(self, why: str) -> None:
        who = self.peer.node if self.peer else self.peername()
        log.warning("closing inter-node link to %s: %s", who, why)
        self.close()

    # ---- output --------------------------------------------------------------------------
    def send(self, channel: int, payload: bytes) -> None:
        """Queued, and written with everything else sent to this peer in this loop turn
        (or at the sender's `flush`)."""
        if self.closed or not self.established:
            return
        # Header and payload apart: the flush's join copies them once (a snapshot chunk's
        # MiB was copied into its frame first).
        self._out += (frame_head(channel, len(payload)), payload)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._out and not self.closed and self._transport is not None:
            data = b"".join(self._out)
            self.bytes_sent += len(data)
            self._transport.write(data)
        self._out.clear()

    def _write(self, channel: int, payload: bytes) -> None:
        if self._transport is not None and not self.closed:
            data = encode_frame(channel, payload)
            self.bytes_sent += len(data)
            self._transport.write(data)

    def heartbeat(self) -> None:
        self.send(Channel.HEARTBEAT, b"")

    def write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() if self._transport else 0

    def peername(self) -> str:
        if self._transport is None:
            return "?"
        peer = self._transport.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def close(self) -> None:
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self._transport is not None:
            self._transport.close()
