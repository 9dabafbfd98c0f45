"""Bounds the time an HTTP client may take to send its first request's headers.

aiohttp waits for a request as long as its keep-alive timeout (75 s), so a connection that
sends nothing, or its headers a byte at a time, holds a socket and a handler that long, and
many of them hold many. `HeaderTimeout` stands between the socket and aiohttp's protocol:
until the blank line that ends the first request's headers has arrived a timer runs, and
when it fires first the connection is closed (and counted). After that it only passes
calls through; later requests on a kept-alive connection are aiohttp's keep-alive's.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

_END_OF_HEADERS: Final = b"\r\n\r\n"


class HeaderTimeout(asyncio.Protocol):
    """Wraps one connection's protocol (aiohttp's request handler); see the module doc."""

    def __init__(
        self, inner: asyncio.Protocol, timeout: float, on_timeout: Callable[[], None]
    ) -> None:
        self._inner = inner
        self._timeout = timeout
        self._on_timeout = on_timeout
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""  # the last bytes seen, in case the blank line spans two reads

    @classmethod
    def factory(
        cls, inner: Callable[[], asyncio.Protocol], timeout: float, on_timeout: Callable[[], None]
    ) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for `loop.create_server`; `timeout` 0 leaves `inner` alone."""
        if not timeout:
            return inner
        return lambda: cls(inner(), timeout, on_timeout)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(self._timeout, self._expired)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if _END_OF_HEADERS in seen:
                self._stop_timer()
            else:
                self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self._inner.connection_lost(exc)

    def _expired(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is not None and not transport.is_closing():
            self._on_timeout()
            log.info("closing %s: no HTTP request headers within %.1f s",
                     transport.get_extra_info("peername"), self._timeout)
            transport.close()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
