"""Where an export's thread writes the archive (`Body`), and the body that is the client's
socket itself (`SocketBody`): an HTTP response's body written by the export's thread, sealed
tables sent from the page cache by `sendfile`.

The node's event loop serves the publishers. When it wrote the archive (`response.write`, a
chunk the thread made at a time), its sends were the biggest part of its time during an
export (py-spy of the node: 273 of its 1191 samples in `send`, against 378 waiting in
`epoll_wait`; 0.26 CPU-s of the loop's per 261 MiB export, perf and schedstat), CPU the
export's pacing did not count and took from the publishers. Here the loop only sends the
response's headers and, after the thread, its end; the bytes between go from the thread,
which waits for room in the socket without the GIL (`poll`) and is paced as its own CPU
time (export.Pace): the kernel's work of the sends included.

The thread writes to a duplicate of the connection's descriptor, so a connection the loop
closes meanwhile (the client went away) fails the thread's next send instead of sending to
a descriptor another connection was given since. The descriptor stays non-blocking (the
loop's transport shares its flags): sends that find the socket full wait in `poll`.
"""

import os
import select
import socket
from collections.abc import Callable, Iterator
from typing import Final, Protocol, runtime_checkable

from broker.backup.archive import CHUNK

_POLL_MS: Final = 1000  # how soon a thread waiting for a full socket sees a cancelled export
_CRLF: Final = b"\r\n"


class Cancelled(Exception):
    """The export was cancelled while its body waited for room in the socket."""


class Body(Protocol):
    """The archive's bytes in order, from the export's thread; `close` once all are written
    (or the export failed): what it wrote is sent or given to the loop once it returns."""

    def write(self, data: bytes | memoryview) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class SendsFiles(Protocol):
    """A body that sends a file's bytes from the page cache, not through this process."""

    def send_file(self, fd: int, size: int) -> Iterator[int]: ...


class SocketBody:
    """A response body (chunked, or the raw bytes up to the connection's close) written
    straight to the connection's socket by the export's thread. `stopped`: whether the
    export was cancelled, looked at while it waits for room."""

    def __init__(self, fd: int, chunked: bool, stopped: Callable[[], bool]) -> None:
        # (the socket object leaves the descriptor's flags as they are: non-blocking)
        self._sock = socket.socket(fileno=os.dup(fd))
        self._chunked = chunked
        self._stopped = stopped
        self._poll = select.poll()
        self._poll.register(self._sock.fileno(), select.POLLOUT)

    def write(self, data: bytes | memoryview) -> None:
        if not len(data):
            return  # an empty chunk would end a chunked body
        if self._chunked:
            self._send([f"{len(data):x}\r\n".encode(), memoryview(data), _CRLF])
        else:
            self._send([memoryview(data)])

    def send_file(self, fd: int, size: int) -> Iterator[int]:
        """`size` bytes of the open file `fd` from its start, as one chunk of the body,
        yielding each piece's length (up to CHUNK) as it is sent: the export paces itself
        between them."""
        if self._chunked and size:
            self._send([f"{size:x}\r\n".encode()])
        offset = 0
        while offset < size:
            piece = min(CHUNK, size - offset)
            end = offset + piece
            while offset < end:
                try:
                    sent = os.sendfile(self._sock.fileno(), fd, offset, end - offset)
                except BlockingIOError:
                    self._wait()
                    continue
                if not sent:
                    raise EOFError(f"the file ended {size - offset} bytes short")
                offset += sent
            yield piece
        if self._chunked and size:
            self._send([_CRLF])

    def _send(self, buffers: list[bytes | memoryview]) -> None:
        """All of `buffers`, in as few system calls as the socket takes."""
        views = [memoryview(b).cast("B") for b in buffers]
        while views:
            try:
                sent = self._sock.sendmsg(views)
            except BlockingIOError:
                self._wait()
                continue
            while views and sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            if views:
                views[0] = views[0][sent:]

    def _wait(self) -> None:
        """Until the socket has room (or is broken: the next send says how)."""
        while not self._poll.poll(_POLL_MS):
            if self._stopped():
                raise Cancelled("the export was cancelled")

    def close(self) -> None:
        self._sock.close()


def plain_socket(transport: object) -> socket.socket | None:
    """The plain stream socket under an asyncio transport (asyncio's or uvloop's), or None:
    a TLS connection (whose bytes only the loop's TLS layer can read and write)."""
    get = getattr(transport, "get_extra_info", None)
    if get is None or get("sslcontext") is not None or get("ssl_object") is not None:
        return None
    sock = get("socket")
    return sock if sock is not None and sock.type == socket.SOCK_STREAM else None


def socket_fd(transport: object) -> int | None:
    """The descriptor of the plain socket under an asyncio transport whose write buffer is
    empty (what it was given is sent: the thread's bytes go after it), or None: a TLS
    connection, or one the loop still writes to."""
    sock = plain_socket(transport)
    size = getattr(transport, "get_write_buffer_size", None)
    if sock is None or size is None or size():
        return None
    return int(sock.fileno())
