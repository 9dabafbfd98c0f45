"""Plain TCP listeners whose connections share one epoll, instead of an asyncio transport each.

An asyncio selector transport costs ~1.6 KiB of Python objects per connection, most of it
fixed: the transport and its attribute dict, a socket object and the TransportSocket that
wraps it, the selector's key, a reader Handle holding a copy of the context, a weak
reference in the loop's transport registry, and the peer and local address tuples. With
10,000 idle clients that is most of what the broker holds for them. Here a connection is
its file descriptor, one entry in a dict and a `StreamTransport` of a few slots: the event
loop watches the one epoll descriptor, and a wake-up serves every ready socket in a pass.

`StreamTransport` keeps asyncio's transport contract (`asyncio.Transport`: write with a
buffer and high/low water marks calling the protocol's pause/resume_writing, close after
the buffer drains, abort, write_eof, pause/resume_reading, `connection_lost` called soon
after, never inside the caller's frame), so the MQTT and WebSocket protocols run on it
unchanged. TLS listeners keep asyncio's transports.
"""

import asyncio
import errno
import logging
import os
import select
import socket
from collections.abc import Callable
from typing import Any, Final

log = logging.getLogger(__name__)

_READ: Final = select.EPOLLIN
_WRITE: Final = select.EPOLLOUT
_MAX_READ: Final = 256 * 1024  # asyncio's max_size for one recv
_HIGH_WATER: Final = 64 * 1024  # asyncio's default write buffer limits
_ACCEPT_ERRORS: Final = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# A connection's descriptor as accept4(2) makes it: non-blocking and close-on-exec.
_ACCEPT_FLAGS: Final = socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
# Nothing (more) to accept now: the listener is read again when the next client comes.
_ACCEPT_DONE: Final = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR, errno.ECONNABORTED)


class Reactor:
    """One epoll for the connections of one listener, watched by the event loop."""

    __slots__ = ("_epoll", "_lost", "_lost_scheduled", "_polling", "_retired", "loop",
                 "transports")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._epoll = select.epoll()
        self._retired = False
        self.transports: dict[int, StreamTransport] = {}
        # Transports whose connection_lost is due (`lost`), and whether a pass of `_poll`
        # is under way (it tells them at its end) or a loop callback is to come.
        self._lost: list[StreamTransport] = []
        self._polling = False
        self._lost_scheduled = False
        loop.add_reader(self._epoll.fileno(), self._poll)

    def add(self, fd: int, transport: "StreamTransport") -> None:
        self.transports[fd] = transport
        self._epoll.register(fd, _READ)

    def watch(self, fd: int, events: int) -> None:
        self._epoll.modify(fd, events)

    def remove(self, fd: int) -> None:
        """Out of the dispatch table: the descriptor's later events are ignored, and the
        epoll forgets it when `StreamTransport.finish` closes it (an epoll drops a
        descriptor's entry once its last reference is closed, and the broker neither dups
        nor forks one), without an EPOLL_CTL_DEL per connection."""
        if self.transports.pop(fd, None) is not None and self._retired and not self.transports:
            self._close()

    def retire(self) -> None:
        """The listener closed: the epoll goes with its last connection."""
        self._retired = True
        if not self.transports:
            self._close()

    def _close(self) -> None:
        if not self._epoll.closed:
            self.loop.remove_reader(self._epoll.fileno())
            self._epoll.close()

    def lost(self, transport: "StreamTransport") -> None:
        """`transport`'s connection_lost is due: called at the end of this pass over the
        ready sockets, or by one loop callback for all those lost outside a pass (a timer's
        close). Not a `call_soon` each: a Handle, a Context copy and a loop turn's share per
        connection, for the one call every connection ends with."""
        self._lost.append(transport)
        if not self._polling and not self._lost_scheduled:
            self._lost_scheduled = True
            self.loop.call_soon(self._tell_lost)

    def _tell_lost(self) -> None:
        self._lost_scheduled = False
        lost, self._lost = self._lost, []
        for transport in lost:
            try:
                transport.finish()
            except Exception:  # as the loop would for its callback: logged, the others told
                log.exception("connection_lost of a transport failed")

    def _poll(self) -> None:
        transports = self.transports
        self._polling = True
        try:
            for fd, events in self._epoll.poll(0):
                transport = transports.get(fd)
                if transport is None:
                    continue
                if events & _WRITE:
                    transport.write_ready()
                if events & ~_WRITE:  # readable, or hung up / in error: a read tells which
                    transport.read_ready()
        finally:
            self._polling = False
        if self._lost:
            self._tell_lost()


class StreamTransport(asyncio.Transport):
    __slots__ = ("_buffer", "_closing", "_eof", "_error", "_fd", "_high", "_lost", "_low",
                 "_protocol", "_protocol_paused", "_reactor", "_reading", "_sock")

    def __init__(self, reactor: Reactor, fd: int, protocol: asyncio.Protocol) -> None:
        # No BaseTransport.__init__: its `extra` dict per connection is what this avoids.
        self._reactor = reactor
        self._fd = fd
        self._protocol = protocol
        self._buffer: bytearray | None = None  # unsent output, allocated when a write blocks
        self._high = _HIGH_WATER
        self._low = _HIGH_WATER // 4
        self._protocol_paused = False
        self._reading = True
        self._closing = False  # close/abort called or the socket failed: no more I/O
        self._lost = False  # connection_lost is scheduled
        self._error: Exception | None = None  # what connection_lost is to be given
        self._eof = False  # write_eof called: shut down once the buffer is sent
        self._sock: socket.socket | None = None  # made on demand (options, shutdown)

    # ---- what the protocol calls ---------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            return self._socket()
        if name in ("peername", "sockname"):
            # Asked of the socket, not kept: an address tuple is ~150 bytes a connection,
            # and only logs and the API ask (while the socket is open).
            sock = self._sock or socket.socket(fileno=self._fd)
            try:
                return sock.getpeername() if name == "peername" else sock.getsockname()
            except OSError:
                return default
            finally:
                if sock is not self._sock:
                    sock.detach()
        return default

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        if self._reading and not self._closing:
            self._reading = False
            self._reactor.watch(self._fd, self._events())

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self._reactor.watch(self._fd, self._events())

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, asyncio.Protocol)
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        high = _HIGH_WATER if high is None else high
        self._high, self._low = high, high // 4 if low is None else low
        self._check_high_water()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return len(self._buffer) if self._buffer is not None else 0

    def can_write_eof(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not data or self._closing:
            return
        buffer = self._buffer
        if buffer is None:
            sent = self._io(os.write, data)
            if sent is None:
                if self._closing:  # failed
                    return
                sent = 0
            if sent == len(data):
                return
            self._buffer = bytearray(memoryview(data)[sent:])
            self._reactor.watch(self._fd, self._events())
        else:
            buffer += data
        self._check_high_water()

    def write_eof(self) -> None:
        if self._closing or self._eof:
            return
        self._eof = True
        if self._buffer is None:
            self._socket().shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Stops reading; the socket closes once what was written has been sent."""
        if self._closing:
            return
        self._closing = True
        if self._buffer is None:
            self._lose(None)
        else:
            self._reactor.watch(self._fd, _WRITE)

    def abort(self) -> None:
        self._closing = True
        self._buffer = None
        self._lose(None)

    # ---- what the reactor calls ----------------------------------------------------------
    def read_ready(self) -> None:
        if self._closing or not self._reading:
            return
        data = self._io(os.read, _MAX_READ)
        if data is None:
            return
        try:
            if data:
                self._protocol.data_received(data)
            elif not self._protocol.eof_received():
                self.close()
            else:
                self.pause_reading()  # the protocol keeps the connection open for writing
        except Exception as exc:
            log.exception("protocol of %s failed", self.get_extra_info("peername"))
            self._fatal(exc)

    def write_ready(self) -> None:
        buffer = self._buffer
        if buffer is None:
            return
        sent = self._io(os.write, buffer)
        if sent is None:
            return
        del buffer[:sent]
        if buffer:
            self._check_low_water()
            return
        self._buffer = None
        self._check_low_water()
        if self._closing:
            self._lose(None)
            return
        self._reactor.watch(self._fd, self._events())
        if self._eof:
            self._socket().shutdown(socket.SHUT_WR)

    # ---- inside ----------------------------------------------------------------------------
    def _io(self, call: Callable[[int, Any], Any], arg: Any) -> Any:
        """`call(fd, arg)`, os.read or os.write; None if it would block, or if it failed,
        which closes the transport (`_fatal`)."""
        try:
            return call(self._fd, arg)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            self._fatal(exc)
            return None

    def _events(self) -> int:
        return (_READ if self._reading else 0) | (_WRITE if self._buffer is not None else 0)

    def _socket(self) -> socket.socket:
        if self._sock is None:
            self._sock = socket.socket(fileno=self._fd)
        return self._sock

    def _check_high_water(self) -> None:
        if not self._protocol_paused and self.get_write_buffer_size() > self._high:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def _check_low_water(self) -> None:
        if self._protocol_paused and self.get_write_buffer_size() <= self._low:
            self._protocol_paused = False
            self._protocol.resume_writing()

    def _fatal(self, exc: Exception) -> None:
        """The socket failed (reset, broken pipe): closed now, the protocol told soon."""
        self._closing = True
        self._buffer = None
        self._lose(exc)

    def _lose(self, exc: Exception | None) -> None:
        """No more events: out of the reactor's table now (its descriptor stays open, so
        no new connection can take its number meanwhile), the protocol told soon after
        (`Reactor.lost`), never inside the caller's frame, and the descriptor closed then."""
        if self._lost:
            return
        self._lost = True
        self._error = exc
        reactor = self._reactor
        reactor.remove(self._fd)
        reactor.lost(self)

    def finish(self) -> None:
        """The reactor's call, once: the protocol told, the descriptor closed."""
        exc, self._error = self._error, None
        try:
            self._protocol.connection_lost(exc)
        finally:
            if self._sock is not None:
                self._sock.close()
            else:
                os.close(self._fd)
            self._sock = None


class Server:
    """What `loop.create_server` returns, as far as the broker uses it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sockets: list[socket.socket],
                 factory: Callable[[], asyncio.Protocol], backlog: int) -> None:
        self._loop = loop
        self._factory = factory
        self._backlog = backlog
        self._closed = asyncio.Event()
        self._accept4, self._errno = _libc_accept4()
        self.sockets = sockets
        self.reactor = Reactor(loop)
        for sock in sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, listener: socket.socket) -> None:
        # The descriptor alone (`_libc_accept4`): a socket object would cost a getsockname
        # to check the descriptor, two enum conversions and a detach, per connection.
        # TCP_NODELAY comes from the listener (`create_server`).
        accept4, listening = self._accept4, listener.fileno()
        for _ in range(self._backlog):
            fd: int = accept4(listening, None, None, _ACCEPT_FLAGS)
            if fd < 0:
                code: int = self._errno()
                if code in _ACCEPT_DONE:
                    return
                exc = OSError(code, os.strerror(code))
                if code not in _ACCEPT_ERRORS:
                    raise exc
                # Out of descriptors or memory: asyncio's answer, a pause, not a busy loop.
                log.error("accepting a connection: %s; trying again in 1 s", exc)
                self._loop.remove_reader(listening)
                self._loop.call_later(1.0, self._resume_accepting, listener)
                return
            protocol = self._factory()
            transport = StreamTransport(self.reactor, fd, protocol)
            self.reactor.add(fd, transport)
            protocol.connection_made(transport)

    def _resume_accepting(self, listener: socket.socket) -> None:
        if not self._closed.is_set():
            self._loop.add_reader(listener.fileno(), self._accept, listener)

    def close(self) -> None:
        """Stops accepting; connections already made go on (as asyncio's servers do)."""
        if self._closed.is_set():
            return
        self._closed.set()
        for sock in self.sockets:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        self.reactor.retire()

    async def wait_closed(self) -> None:
        await self._closed.wait()


async def create_server(
    loop: asyncio.AbstractEventLoop, factory: Callable[[], asyncio.Protocol], host: str,
    port: int, *, ssl: Any = None, reuse_address: bool = True, backlog: int = 100,
) -> Any:
    """A listener as `loop.create_server` makes one (every address the host resolves to),
    plain TCP on one epoll (this module), TLS on asyncio's transports."""
    if ssl is not None:
        return await loop.create_server(factory, host, port, ssl=ssl,
                                        reuse_address=reuse_address, backlog=backlog)
    infos = _numeric_addresses(host, port) or await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            if reuse_address:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio: IPv4 gets its own socket
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            # Linux copies it to every socket accepted from this one (`Server._accept`).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return Server(loop, sockets, factory, backlog)


def _libc_accept4() -> tuple[Any, Callable[[], int]]:
    """accept4(2) of the C library, and the errno its last failure left. Python's
    `socket.accept` passes it SOCK_CLOEXEC only, which costs a connection an ioctl(FIONBIO)
    more, a peer address formatted into a tuple that nobody reads, and each pass over the
    waiting clients a BlockingIOError raised and caught at its end: together ~6% of the
    broker's user CPU per CONNECT/CONNACK/DISCONNECT in a profile (issue 42), the ctypes
    call ~3.5%. ctypes (~2 ms to import) comes when a plain listener starts, not with this
    module."""
    import ctypes

    call = ctypes.CDLL(None, use_errno=True).accept4
    call.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
    call.restype = ctypes.c_int
    return call, ctypes.get_errno


def _numeric_addresses(host: str, port: int) -> list[Any] | None:
    """The addresses of a host given as an IP address, without the executor: resolving a
    name may block, so `loop.getaddrinfo` runs on a thread, whose first use costs 2.5-5 ms
    of the start (the executor and its thread made); a literal needs no lookup (None: a
    name, or the empty host, all interfaces). Passed as bytes: a `str` host is encoded by
    the `idna` codec, whose import (with `stringprep` and `unicodedata`) costs a start
    ~1.5 ms, and an address is ASCII."""
    if not host or not host.isascii():
        return None
    try:
        return socket.getaddrinfo(host.encode(), port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST)
    except socket.gaierror:
        return None
