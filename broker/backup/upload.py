"""An import's upload read from the client's socket by a thread of its own (`SocketUpload`),
the mirror of the export's body (body.py): the bytes go from the socket into the pipe the
unpack reads (pipe.py) without the event loop.

The loop took each of the upload's reads, and aiohttp's parser copied the body out of them
(0.42 CPU-s of the node per 261 MiB import, on the thread that serves the publishers). Here
the loop parses the request's headers and hands over what it had read of the body; the
thread reads the rest (`Content-Length` of it) from a duplicate of the connection's
descriptor, waiting in `poll` without the GIL. The duplicate: a connection the loop closes
meanwhile fails the thread's next read instead of reading another connection's. The
descriptor stays non-blocking (the loop's transport shares its flags).

A client that sends nothing for `idle_s` (the HTTP API's header_timeout) fails the upload,
and so does one that closes early: the pipe ends short, which the unpack refuses (the
archive's checksums come last) before anything is changed.
"""

import os
import select
import socket
import time
from collections.abc import Callable
from typing import Final

from broker.backup.archive import CHUNK
from broker.backup.pipe import Pipe

_POLL_MS: Final = 1000  # how soon a thread waiting for bytes sees a cancelled import


class UploadStopped(Exception):
    """The body did not arrive whole: the client went silent, closed early, or the import
    was cancelled."""


class SocketUpload:
    """`length` bytes of a request's body read from the socket `fd` into a pipe, on the
    calling thread (`run`). `stopped`: whether the import was cancelled, looked at while it
    waits for bytes; `idle_s` 0: no bound on a silence."""

    def __init__(self, fd: int, length: int, idle_s: float,
                 stopped: Callable[[], bool]) -> None:
        self._sock = socket.socket(fileno=os.dup(fd))
        self._left = length
        self._idle_s = idle_s
        self._stopped = stopped

    def run(self, pipe: Pipe) -> None:
        """Blocking: until the body's last byte is given to `pipe`; raises UploadStopped."""
        poll = select.poll()
        poll.register(self._sock.fileno(), select.POLLIN)
        try:
            while self._left:
                try:
                    piece = self._sock.recv(min(self._left, CHUNK))
                except BlockingIOError:
                    self._wait(poll)
                    continue
                except OSError as error:
                    raise UploadStopped(f"{self._left} bytes short: {error}") from None
                if not piece:
                    raise UploadStopped(f"the client closed the connection {self._left}"
                                        f" bytes short")
                self._left -= len(piece)
                pipe.give(piece)
        finally:
            self._sock.close()

    def _wait(self, poll: "select.poll") -> None:
        """Until the socket has bytes (or is closed: the next read says so)."""
        deadline = time.monotonic() + self._idle_s
        while not poll.poll(_POLL_MS if not self._idle_s else
                            max(1, min(_POLL_MS, int((deadline - time.monotonic()) * 1000)))):
            if self._stopped():
                raise UploadStopped("the import was cancelled")
            if self._idle_s and time.monotonic() >= deadline:
                raise UploadStopped(f"no byte of the body for {self._idle_s:g} s"
                                    f" ({self._left} bytes short)")
