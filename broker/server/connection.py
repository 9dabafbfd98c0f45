"""One client connection: bytes in, packets dispatched to handlers, bytes out.

The transport is anything with write/close (TCP, TLS or the WebSocket adapter). Output is
collected and written once per event-loop turn, so a burst of deliveries costs one syscall
per destination rather than one per message. No exception raised by a packet ever escapes:
a violation becomes DISCONNECT with its reason code (v5) or a close (v3).
"""

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable
from time import monotonic
from typing import Any, Final

from broker.auth.acl import Access
from broker.auth.authorization import AclCache
from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import (
    MQTT_3_1_1,
    MQTT_5,
    PacketType,
    ReasonCode,
)
from broker.mqtt.errors import (
    MalformedPacket,
    MQTTError,
    ProtocolError,
    UnsupportedProtocolVersion,
)
from broker.mqtt.packets import Connack, Disconnect, Packet, Will
from broker.node import Node
from broker.server.ack_order import AckOrder, returns_quota
from broker.server.delivery import deliver, drain, resend_inflight
from broker.server.handlers import HANDLERS
from broker.server.handlers.auth import ConnectionAuth
from broker.server.output import OutputBatch
from broker.server.ratelimit import ClientRates
from broker.server.storage_refusal import storage_failure
from broker.server.wheel import wheel
from broker.session.session import Delivery, Session

log = logging.getLogger(__name__)

# Why a connection is not being read (bits of `Connection._paused`). Each reason lifts only
# itself, so a SUBSCRIBE applied over several turns and acknowledgements waiting on storage
# cannot resume each other's pause.
PAUSE_HOLD: Final = 1
PAUSE_STORAGE: Final = 2
PAUSE_RATE: Final = 4  # above `messages_rate` / `bytes_rate` until the bucket refills
_PUBLISH: Final = PacketType.PUBLISH
_RESET: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset
# How long an ended connection's input is still read (and dropped) before the socket goes,
# so that a client still sending can read the reason it was sent (`Connection.close`).
CLOSE_LINGER: Final = 2.0


class Connection:
    # Slots: ten thousand idle connections should cost little more than their sockets.
    __slots__ = (
        "_acks", "_backlogged", "_due", "_flush_pending", "_held", "_in_aliases", "_last_rx",
        "_loop", "_out", "_out_aliases", "_output", "_packet_timeout", "_packet_timer",
        "_partial_since", "_paused", "_rate_timer", "_rates", "acl_cache", "auth",
        "claim_stamp", "clean_start", "client_alias_max", "client_id", "client_max_packet",
        "closed", "connected", "decoder", "incoming_unacked", "keepalive", "node",
        "send_window", "session", "stats", "transport", "username", "version", "will",
    )

    def __init__(self, node: Node, transport: Any, output: OutputBatch,
                 rates: ClientRates | None = None) -> None:
        config = node.config
        self.node = node
        self.stats = node.stats
        self.transport = transport
        self.decoder = Decoder(max_packet_size=config["mqtt.max_packet_size"])
        self.version = MQTT_3_1_1
        self.connected = False
        self.closed = False
        self.client_id = ""
        self.session: Session | None = None
        self.will: Will | None = None
        self.clean_start = True
        self.username: str | None = None
        # The connection's ACL decisions; None when nothing is asked (Security.authorizes).
        self.acl_cache = AclCache(0) if node.security.authorizes else None
        # Enhanced authentication and a JWT's expiry (handlers.auth); None for most.
        self.auth: ConnectionAuth | None = None
        # When this connection claimed its client ID in the cluster (hybrid clock, site): of
        # two connections of one ID on two nodes after a partition, the older one ends.
        self.claim_stamp: tuple[int, str] = (0, "")
        self.keepalive = 0
        # Limits the client announced in CONNECT (MQTT 5 defaults when absent).
        self.send_window = config["mqtt.max_inflight"]
        self.client_max_packet: int | None = None
        self.client_alias_max = 0
        # Topic aliases and unsent output: made on first use, as are other containers
        # below (an empty dict or list is 56-64 bytes, times every idle connection).
        self._in_aliases: dict[int, str] | None = None
        self._out_aliases: dict[str, int] | None = None
        self._out: list[bytes] | None = None
        # Acknowledgements waiting for storage (ack_order.py), made when one first waits.
        self._acks: AckOrder | None = None
        # `incoming_unacked` mirrors a v5 client's spent send quota (MQTT 5.0 section 4.9):
        # QoS 1/2 PUBLISHes whose PUBACK, PUBCOMP or error PUBREC has not left.
        self.incoming_unacked = 0
        self._paused = 0  # PAUSE_* bits
        # When the packet now arriving began (0: none is partly received), and the timer
        # that bounds its arrival (`mqtt.packet_arrival_timeout`; armed while one is).
        self._partial_since = 0.0
        self._packet_timeout: float = config["mqtt.packet_arrival_timeout"]
        self._packet_timer: asyncio.TimerHandle | None = None
        self._output = output
        self._flush_pending = False
        # Packets waiting for one that is handled over several loop turns (`hold_input`).
        self._held: list[Packet] | None = None
        self._loop = output.loop
        # Times are time.monotonic(), the loop's clock (asyncio's `time()`, uvloop's too)
        # without a Python call per read to ask the loop for it.
        self._last_rx = monotonic()
        # The listener's `messages_rate` / `bytes_rate` buckets (None: no limit, and no
        # cost but one attribute check per read), and the timer that ends a throttling.
        self._rates = rates.limiter(self._last_rx) if rates is not None else None
        self._rate_timer: asyncio.TimerHandle | None = None
        # Unsent output passed `force_shutdown.max_heap_size` (the transport said so).
        self._backlogged = False
        # The wheel's slot of this connection's deadline: CONNECT in time, then keep-alive.
        self._due: int | None = wheel(self._loop).add(self, config["mqtt.idle_timeout"])
        node.connections.add(self)
        self.stats.connections_total += 1

    # ---- input -------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.stats.bytes_received += len(data)
        decoder = self.decoder
        error: MQTTError | None = None
        try:
            packets = decoder.feed(data)
        except MQTTError as exc:
            packets, error = getattr(exc, "packets", []), exc
        if packets:
            # Only whole packets are activity (MQTT-3.1.2-22: "a Control Packet"): a byte
            # now and then must not keep a connection alive.
            now = self._last_rx = monotonic()
            self._partial_since = now if decoder.partial else 0.0
        elif not self._partial_since and decoder.partial:
            self._partial_since = monotonic()
        if self._partial_since and self._packet_timer is None and self._packet_timeout:
            self._packet_timer = self._loop.call_later(
                self._packet_timeout, self._check_packet_arrival)
        self._handle(packets, error)
        error = None  # its traceback holds this frame: no cycle left for the collector
        if self._rates is not None:
            self._throttle(len(data), packets)

    def _throttle(self, size: int, packets: list[Packet]) -> None:
        """Charges a read to the rate buckets; in debt, the client is not read until the
        refill has paid it back (its data waits in the socket, nothing is dropped)."""
        rates = self._rates
        assert rates is not None
        messages = 0
        if rates.messages is not None:
            for packet in packets:
                if packet.type == _PUBLISH:
                    messages += 1
        wait, limit = rates.charge(monotonic(), messages, size)
        if wait <= 0.0 or self.closed:
            return
        if self._rate_timer is not None:
            # Already not read, and more debt: the later frames of one WebSocket read.
            self._rate_timer.cancel()
        else:
            self.stats.throttle(limit)
            self.pause_input(PAUSE_RATE)
        self._rate_timer = self._loop.call_later(wait, self._end_throttle)

    def _end_throttle(self) -> None:
        self._rate_timer = None
        self.resume_input(PAUSE_RATE)

    def _handle(self, packets: list[Packet], error: MQTTError | None) -> None:
        handlers = HANDLERS
        output = self._output
        output.reading()
        try:
            try:
                for packet in packets:
                    if self.closed:
                        break
                    if self._held is not None:
                        self._held.append(packet)
                        self.pause_input(PAUSE_HOLD)
                        continue
                    # Connected: straight to the handler (a call less per packet on the hot
                    # path); otherwise, or for a type with no handler, `_dispatch` decides.
                    handler = handlers.get(packet.type) if self.connected else None
                    if handler is None:
                        self._dispatch(packet)
                    else:
                        handler(self, packet)
            except MQTTError as exc:
                error = exc
            except Exception:
                log.exception("internal error handling a packet from %s",
                              self.client_id or self.peer)
                error = MQTTError("internal error", ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
            if error is not None and not self.closed:
                self.fail(error)
        finally:
            output.read_done()  # the read's output, every destination's, leaves now

    def hold_input(self, until: "asyncio.Task[None] | None" = None) -> None:
        """The packet being handled finishes in later loop turns (a large SUBSCRIBE is
        applied in slices, a password is checked): the client's next packets wait for it,
        in order, and reading pauses once one arrives (most clients send nothing before
        their CONNACK: a pause and a resume would cost them two epoll changes). They wait
        until `until` ends, or (None) until `release_input`; a held connection's task may
        take the hold over. A failure ends the connection as a handler's would."""
        if self._held is None:
            self._held = []
        if until is not None:
            until.add_done_callback(self._release_held)

    def _release_held(self, until: "asyncio.Task[None]") -> None:
        # Retrieved first, also for a connection closed meanwhile: a task whose exception is
        # never read is logged by asyncio as an error with its traceback.
        self.release_input(None if until.cancelled() else until.exception())

    def release_input(self, error: BaseException | None) -> None:
        """The held packet is done (`error`: it failed): the packets held behind it go on."""
        held, self._held = self._held or [], None
        if self.closed:
            return
        self.resume_input(PAUSE_HOLD)
        if error is None:
            self._handle(held, None)
            return
        if not isinstance(error, MQTTError):
            log.error("internal error handling a packet from %s", self.client_id,
                      exc_info=error)
            error = MQTTError("internal error", ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
        self.fail(error)
        self._output.flush()

    def pause_input(self, reason: int) -> None:
        """Stops reading from the client for `reason` (a PAUSE_* bit): what it sends waits
        in the kernel's socket buffer, then its own, instead of in broker memory."""
        if not self._paused:
            self.transport.pause_reading()
        self._paused |= reason

    def resume_input(self, reason: int) -> None:
        """Lifts the pause for `reason`; reading resumes once no reason is left."""
        if not self._paused & reason:
            return
        self._paused &= ~reason
        if self._paused or self.closed:
            return
        self.transport.resume_reading()
        # What the client sent meanwhile was not read yet: neither its keep-alive nor the
        # arrival of a packet it was in the middle of may count the pause against it.
        now = self._last_rx = monotonic()
        if self._partial_since:
            self._partial_since = now

    def _check_packet_arrival(self) -> None:
        """Closes a connection whose packet, once started, takes longer than
        `mqtt.packet_arrival_timeout` to arrive (a sender stalled mid-packet would hold its
        buffer, up to `mqtt.max_packet_size`, for as long as it keeps the socket open)."""
        self._packet_timer = None
        since = self._partial_since
        if not since or self.closed:
            return
        late, limit = monotonic() - since, self._packet_timeout
        if late < limit or self._paused:
            self._packet_timer = self._loop.call_later(
                limit - late if late < limit else limit, self._check_packet_arrival)
            return
        self.stats.time_out("packet_arrival")
        self.fail(MQTTError(f"a packet still unfinished {late:.1f} s after it began",
                            ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR))

    def _dispatch(self, packet: Packet) -> None:
        packet_type = packet.type
        if not self.connected and packet_type != PacketType.CONNECT:
            if self.auth is None or self.auth.resume is None:
                raise ProtocolError(f"{packet_type.name} before CONNECT")
            # MQTT-3.1.2-30: during the CONNECT's exchange only AUTH or DISCONNECT.
            if packet_type == PacketType.DISCONNECT:
                return self.close()
            if packet_type != PacketType.AUTH:
                raise ProtocolError(f"{packet_type.name} before the authentication ended")
        handler = HANDLERS.get(packet_type)
        if handler is None:
            raise ProtocolError(f"a client must not send {packet_type.name}")
        handler(self, packet)

    def fail(self, error: MQTTError) -> None:
        """Ends the connection for a protocol violation, telling a v5 client why."""
        if isinstance(error, MalformedPacket):
            self.stats.packets_malformed += 1
        log.info("closing %s: %s (%s)", self.client_id or self.peer, error,
                 ReasonCode(error.reason_code).name)
        if self.connected:
            self.disconnect(error.reason_code)
        elif self.decoder.version == MQTT_5 or isinstance(error, UnsupportedProtocolVersion):
            # Before CONNACK a v5 client learns the reason from a CONNACK (MQTT 5.0 section
            # 3.2.2.2); v3.1.1 allows a CONNACK only for an unacceptable protocol level, any
            # other bad CONNECT is closed silently (MQTT-3.1.4-1).
            self.version = self.decoder.version or MQTT_3_1_1
            self.send_packet(Connack(False, error.reason_code))
            self.close()
        else:
            self.close()

    # ---- output ------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        out = self._out
        if out is None:
            self._out = [data]
        else:
            out.append(data)
        self._flush_soon()

    def _flush_soon(self) -> None:
        """What was queued in `_out` leaves with this loop turn's output batch."""
        if not self._flush_pending:
            self._flush_pending = True
            self._output.add(self)

    def send_when(self, durable: Awaitable[Any] | None, data: bytes, size: int = 0) -> None:
        """Sends the acknowledgement `data` once `durable` is done and after every earlier
        deferred one (ack_order.py); `size` is what storage holds for it meanwhile (the
        PUBLISH's payload): at the bounds the client is not read until storage catches up."""
        acks = self._acks
        if durable is None and (acks is None or not acks.waiting):
            self.send(data)
            if self.incoming_unacked and returns_quota(data):
                self.incoming_unacked -= 1
            return
        if acks is None:
            config = self.node.config
            acks = self._acks = AckOrder(config["mqtt.max_awaiting_storage"],
                                         config["mqtt.max_awaiting_storage_bytes"])
        if acks.add(durable, data, size, self._send_deferred):
            self.pause_input(PAUSE_STORAGE)

    def _send_deferred(self, _: object = None) -> None:
        acks = self._acks
        assert acks is not None
        packets, failed = acks.ready()
        if packets and not self.closed:
            if self._out is None:
                self._out = []
            self._out.extend(packets)
            if self.incoming_unacked:
                returned = sum(map(returns_quota, packets))
                self.incoming_unacked = max(0, self.incoming_unacked - returned)
            self._flush_soon()
        if failed is not None:
            if not self.closed:
                self.fail(storage_failure(self.client_id, failed))
            return
        if self._paused & PAUSE_STORAGE and acks.below_half():
            self.resume_input(PAUSE_STORAGE)

    def send_packet(self, packet: Packet) -> None:
        self.send(encode(packet, self.version))

    def flush(self) -> None:
        self._flush_pending = False
        out, self._out = self._out, None
        if not out or self.closed or self.transport.is_closing():
            # A transport that failed (the peer reset) is closing before connection_lost
            # runs: writing to it only logs asyncio's "socket.send() raised" warning.
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        if self._backlogged and self._shed():
            return
        self.stats.bytes_sent += len(data)
        self.transport.write(data)

    def output_backlogged(self, backlogged: bool) -> None:
        """The transport's unsent output went above `force_shutdown.max_heap_size` (its
        high-water mark: the listener forwards pause_writing) or back under a quarter of it
        (resume_writing). Meanwhile each flush checks it first."""
        self._backlogged = backlogged

    def _shed(self) -> bool:
        """Closes a client that does not read what it is sent: more output is due and what
        it was sent before is still above the bound. Checked before writing, not after, so
        one large write (a resent window of large messages) to a client that reads is not
        mistaken for one that does not; the bound is exceeded by one write at most. Its
        unsent output is discarded (a close would wait for the client to read it); a durable
        session keeps its messages in storage, a memory session its unacknowledged ones."""
        unsent = self.transport.get_write_buffer_size()
        bound = self.node.config["force_shutdown.max_heap_size"]
        if not bound or unsent <= bound:
            return False
        self.stats.refuse("max_heap_size")
        log.warning("closing %s: %d bytes unsent, past force_shutdown.max_heap_size (%d)",
                    self.client_id or self.peer, unsent, bound)
        self.closed = True
        self._cancel_timers()
        # A reset, not a FIN: the kernel drops what it holds for the client too, instead of
        # keeping it (up to the socket's send buffer) for as long as the client will not read.
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        self.transport.abort()
        return True

    def deliver(self, delivery: Delivery) -> None:
        """A message for this client: send now, or queue when the in-flight window is full
        (delivery.py)."""
        deliver(self, delivery)

    def drain(self) -> None:
        """Moves queued messages into the in-flight window as it opens up."""
        drain(self)

    def resend_inflight(self) -> None:
        """On session resume: the in-flight window again, with DUP (delivery.py)."""
        resend_inflight(self)

    def authorized(self, topic: str, access: Access) -> bool:
        cache = self.acl_cache
        if cache is None:
            return True
        security = self.node.security
        if cache.generation == security.generation and (
                cache.read if access is Access.READ else cache.write).get(topic):
            return True  # allowed before: the common case, without a call
        return security.allows(cache, self.client_id, self.username, topic, access)

    # ---- lifecycle ---------------------------------------------------------------------
    def start_keepalive(self, keepalive: int) -> None:
        self.keepalive = keepalive
        self._cancel_timer()
        if keepalive:
            self._due = wheel(self._loop).add(self, self._keepalive_limit())

    def _keepalive_limit(self) -> float:
        return self.keepalive * self.node.config["mqtt.keepalive_multiplier"]

    def timer_due(self) -> None:
        """The wheel: the deadline set last has come. Before CONNECT it was CONNECT's;
        after, the keep-alive's, checked against the last whole packet received."""
        self._due = None
        if self.closed:
            return
        if not self.connected:
            log.info("closing %s: no CONNECT in time", self.peer)
            self.close()
            return
        if not self.keepalive:
            return
        limit = self._keepalive_limit()
        idle = monotonic() - self._last_rx
        if idle < limit:
            self._due = wheel(self._loop).add(self, limit - idle)
        elif self._paused:  # we are the ones not reading: not the client's silence
            self._due = wheel(self._loop).add(self, limit)
        else:
            self.fail(MQTTError("keepalive timeout", ReasonCode.KEEP_ALIVE_TIMEOUT))

    def disconnect(self, reason_code: int) -> None:
        if self.connected and self.version == MQTT_5 and not self.closed:
            self.send_packet(Disconnect(reason_code))
        self.close()

    def take_over(self, reason_code: int) -> None:
        """Another connection claims our client ID: the session is handed over as the
        connection closes, right now."""
        self.disconnect(reason_code)

    def close(self, linger: bool = True) -> None:
        """Ends the connection; its session is released now, the socket a little later.

        Closing a socket with unread input makes the kernel answer with a reset, and a
        client still sending (a burst past its Receive Maximum) gets the reset before it
        has read our last packet, which its kernel then throws away: the client sees EPIPE
        or ECONNRESET, never the DISCONNECT's or CONNACK's reason. So our side is shut for
        writing once the output has left (a FIN after the last packet), what the client
        still sends is read and dropped, and the socket closes when the client closes its
        side, or after CLOSE_LINGER. TLS has no half-close (asyncio's TLS close sends
        close_notify and waits for the peer's): it closes as before. After the client's
        DISCONNECT (`linger` False) it sends nothing more (MQTT-3.14.4-1), so nothing can
        be left unread: the socket closes once our output has left, as Mosquitto's does,
        without a shutdown, a timer and a wake-up for the client's FIN per connection."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        self._cancel_timers()
        self.node.connections.discard(self)
        self._release_session()
        transport = self.transport
        if not linger or not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:  # the peer is gone already (ENOTCONN): nothing left to linger for
            transport.abort()
            return
        if self._paused:
            transport.resume_reading()  # data_received drops what a closed one reads
        self._loop.call_later(CLOSE_LINGER, transport.abort)

    def connection_lost(self) -> None:
        """Called by the transport adapter once the socket is gone, whatever the reason."""
        self.closed = True
        self._cancel_timers()
        self.node.connections.discard(self)
        self._release_session()

    def _release_session(self) -> None:
        session, self.session = self.session, None
        if session is not None and session.connection is self:
            will, self.will = self.will, None
            self.node.sessions.detach(session, will)

    def _cancel_timer(self) -> None:
        if self._due is not None:
            wheel(self._loop).discard(self, self._due)
            self._due = None

    def _cancel_timers(self) -> None:
        self._cancel_timer()
        if self.auth is not None:
            self.auth.cancel()
        if self._rate_timer is not None:
            self._rate_timer.cancel()
            self._rate_timer = None
        if self._packet_timer is not None:
            self._packet_timer.cancel()
            self._packet_timer = None

    @property
    def peer(self) -> str:
        """The client's address, for logs and the API: formatted when asked, as the
        transport keeps it anyway."""
        peer = self.transport.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    @property
    def in_aliases(self) -> dict[int, str]:
        """Topic aliases the client set (MQTT 5.0 section 3.3.2.3.4)."""
        if self._in_aliases is None:
            self._in_aliases = {}
        return self._in_aliases

    @property
    def out_aliases(self) -> dict[str, int]:
        """Topic aliases set towards the client, up to its Topic Alias Maximum."""
        if self._out_aliases is None:
            self._out_aliases = {}
        return self._out_aliases
