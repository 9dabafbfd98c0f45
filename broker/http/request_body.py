"""An import's request body into the pipe the unpack reads (backup/pipe.py): read from the
socket by a thread (backup/upload.py) where it can be, else by the event loop.

The thread takes a plain (not TLS) connection's `Content-Length` body whose request aiohttp
has not decoded (no `Content-Encoding`): the loop stops reading the socket, hands over what
aiohttp had read of the body already (the upload's first bytes often arrive with its
headers), and the thread reads the rest. aiohttp's parser never sees the body's end, so the
connection is closed after the response (`took_over`), never kept alive for a next request
the parser would take for more body. A chunked body, or a TLS connection, is read by the
loop, as aiohttp gives it. Either way a body that goes silent for `idle_s` (the HTTP API's
header_timeout) fails the upload.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from aiohttp import ClientError, web
from aiohttp.http_exceptions import HttpProcessingError

from broker.backup.body import plain_socket
from broker.backup.pipe import Pipe
from broker.backup.upload import SocketUpload, UploadStopped


class Received(NamedTuple):
    """How the body went: `by_thread` (the response must close the connection) and why it
    stopped short (None: it arrived whole)."""

    by_thread: bool
    stopped: str | None


async def feed(request: web.Request, pipe: Pipe, idle_s: float) -> Received:
    """Gives the body to `pipe`, then ends it."""
    upload = None
    try:
        upload = await _take_over(request, pipe, idle_s)
        if upload is None:
            await _feed_from_loop(request, pipe, idle_s)
        else:
            await _run(upload, pipe)
        return Received(upload is not None, None)
    except UploadStopped as error:
        return Received(True, str(error))
    except (OSError, TimeoutError, ClientError, HttpProcessingError) as error:
        return Received(upload is not None, f"{type(error).__name__}: {error}")
    finally:
        pipe.end()
        if upload is not None:
            # For aiohttp, which did not see the body's end: no lingering wait for more of
            # it after the response (and the reading feed_eof resumes paused again).
            request.content.feed_eof()
            _pause(request)


async def _take_over(request: web.Request, pipe: Pipe, idle_s: float) -> SocketUpload | None:
    """A thread's reader of the body's rest, the loop no longer reading the socket and what
    aiohttp read given to `pipe`; None: the loop must read it (see the module docstring)."""
    length = request.content_length
    sock = plain_socket(request.transport)
    if (length is None or sock is None or "Content-Encoding" in request.headers
            or "Transfer-Encoding" in request.headers):
        return None
    content = request.content
    _pause(request)
    # What aiohttp holds; a read may resume its parsing of bytes it had put aside (and the
    # transport's reading: paused again after each, before the loop runs anything else).
    while piece := content.read_nowait(-1):
        _pause(request)
        await pipe.put(piece)
    task = asyncio.current_task()
    return SocketUpload(sock.fileno(), length - content.total_bytes, idle_s,
                        lambda: task is None or task.cancelling() > 0 or task.done())


def _pause(request: web.Request) -> None:
    transport = request.transport
    if transport is not None and not transport.is_closing():  # (the client may be gone)
        transport.pause_reading()


async def _run(upload: SocketUpload, pipe: Pipe) -> None:
    """On a thread of its own; cancelled, the loop does not wait for it (it sees the
    cancellation within a poll, upload.py)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="upload")
    try:
        await asyncio.get_running_loop().run_in_executor(pool, upload.run, pipe)
    finally:
        pool.shutdown(wait=False)


async def _feed_from_loop(request: web.Request, pipe: Pipe, idle_s: float) -> None:
    # Pieces as the socket gave them (no join into larger ones on the loop: the import's
    # thread reads a member's data a piece at a time, pipe.py).
    chunks = request.content.iter_any()
    while True:
        async with asyncio.timeout(idle_s or None):
            piece = await anext(chunks, b"")
        if not piece:
            return
        await pipe.put(piece)
