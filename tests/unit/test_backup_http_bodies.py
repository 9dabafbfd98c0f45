"""The backup's HTTP bodies through a real aiohttp server, plain and TLS: an import's upload
(broker/http/request_body.py) is read by a thread on a plain connection, the bytes aiohttp
had read with the headers handed over first, the connection closed after the response; by
the loop over TLS or when chunked; a silent client stops it either way. An export's body
(backup_api._open_body) is written by a thread on a plain connection, by the loop over TLS
(its fallback); the client gets every byte in order either way. A client that closes
mid-body stops the upload."""

import asyncio
import http.client
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from broker.backup.body import Body
from broker.backup.pipe import Pipe
from broker.http.backup_api import _open_body
from broker.http.request_body import Received, feed
from tests.support.pki import make_ca, server_certificate
from tests.unit.test_backup_upload import drain

BODY = os.urandom(3 << 20)  # more than aiohttp buffers: most of it comes after the handover


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(the server's context, the client's)."""
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory)
    cert, key = server_certificate(directory, ca)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(ca[0]))


@asynccontextmanager
async def serving(handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                  context: ssl.SSLContext | None) -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_post("/", handler)
    # (lingering: how long aiohttp reads on after a response for the rest of a body the
    # handler left, 10 s by default; our silent client's)
    runner = web.AppRunner(app, access_log=None, lingering_time=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


class Uploads:
    """A handler feeding each request's body to a pipe, read on a thread as the unpack
    does; what each got."""

    def __init__(self, idle_s: float = 10) -> None:
        self.idle_s = idle_s
        self.got: list[tuple[Received, bytes, int]] = []
        self.handled = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        buffered = request.content.total_bytes  # what aiohttp read with the headers
        loop = asyncio.get_running_loop()
        pipe = Pipe(loop)
        feeding = asyncio.ensure_future(feed(request, pipe, self.idle_s))
        data = await loop.run_in_executor(None, drain, pipe)
        received = await feeding
        self.got.append((received, data, buffered))
        self.handled.set()
        response = web.Response(text="ok")
        if received.by_thread:
            response.force_close()
        return response


def _post(port: int, context: ssl.SSLContext | None, body: bytes | Iterator[bytes],
          headers: dict[str, str]) -> http.client.HTTPResponse:
    connection = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
                  if context else http.client.HTTPConnection("127.0.0.1", port, timeout=30))
    # (a bytes body goes out with the headers in one send: aiohttp reads some with them)
    connection.request("POST", "/", body=body, headers=headers,
                       encode_chunked=not isinstance(body, bytes))
    response = connection.getresponse()
    response.read()
    return response


def _post_raw(port: int) -> bytes:
    """The body's first MiB in the send of the headers (aiohttp reads some with them), the
    rest after; what the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                     % len(BODY) + BODY[:1 << 20])
        sock.sendall(BODY[1 << 20:])
        answer = bytearray()
        while data := sock.recv(65536):
            answer += data
        return bytes(answer)


async def test_a_plain_upload_is_read_by_a_thread_and_the_connection_closed() -> None:
    uploads = Uploads()
    async with serving(uploads.handle, None) as port:
        answer = await asyncio.to_thread(_post_raw, port)  # (ends: the server closed)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nConnection: close\r\n" in answer
    [(received, data, buffered)] = uploads.got
    assert received == Received(True, None)
    assert buffered > 0  # bytes aiohttp had read were handed over first
    assert data == BODY


@pytest.mark.parametrize("how", ["tls", "chunked"])
async def test_the_loop_reads_an_upload_over_tls_or_chunked(
        how: str, tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    uploads = Uploads()
    server, client = tls if how == "tls" else (None, None)
    body: bytes | Iterator[bytes] = (BODY if how == "tls" else
                                     iter([BODY[:1000], BODY[1000:2 << 20], BODY[2 << 20:]]))
    async with serving(uploads.handle, server) as port:
        response = await asyncio.to_thread(_post, port, client, body, {})
    assert response.status == 200
    assert response.getheader("Connection") != "close"
    [(received, data, _)] = uploads.got
    assert received == Received(False, None)
    assert data == BODY


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_silent_client_stops_the_upload(chunked: bool) -> None:
    uploads = Uploads(idle_s=0.3)
    head = (b"POST / HTTP/1.1\r\nHost: x\r\n" + (b"Transfer-Encoding: chunked\r\n\r\n10\r\n"
            if chunked else b"Content-Length: 100\r\n\r\n") + b"0123456789abcdef")
    async with serving(uploads.handle, None) as port:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(head)  # and nothing more
            answer = await asyncio.to_thread(sock.recv, 4096)
    assert answer.startswith(b"HTTP/1.1 200")
    [(received, data, _)] = uploads.got
    assert data == b"0123456789abcdef"
    if chunked:  # the loop's read timed out
        assert received == Received(False, "TimeoutError: ")
    else:
        assert received == Received(True, "no byte of the body for 0.3 s (84 bytes short)")


async def test_a_client_that_closes_mid_body_stops_the_upload() -> None:
    uploads = Uploads()
    async with serving(uploads.handle, None) as port:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
                         + BODY[:300_000])
        await uploads.handled.wait()  # (no response to wait for)
    [(received, data, _)] = uploads.got
    # (the thread's "closed the connection N bytes short", or the loop's reset when the
    # close came before the handler)
    assert received.stopped is not None, received
    assert BODY.startswith(data)


@pytest.mark.parametrize("use_tls", [False, True])
async def test_an_export_body_is_written_by_a_thread_or_over_tls_by_the_loop(
        use_tls: bool, tls: tuple[ssl.SSLContext, ssl.SSLContext], tmp_path: Path) -> None:
    kinds: list[str] = []
    pieces = [BODY[:100], BODY[100:(1 << 20) + 7], BODY[(1 << 20) + 7:]]

    def write(body: Body) -> None:
        for piece in pieces:
            body.write(memoryview(piece))
        body.close()

    async def export(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-tar"})
        body = await _open_body(request, response, lambda: False)
        kinds.append(type(body).__name__)
        await asyncio.get_running_loop().run_in_executor(None, write, body)
        await response.write_eof()
        return response

    server, client = tls if use_tls else (None, None)
    async with serving(export, server) as port:
        def fetch() -> bytes:
            connection = (http.client.HTTPSConnection("127.0.0.1", port, context=client)
                          if client else http.client.HTTPConnection("127.0.0.1", port))
            connection.request("POST", "/", body=b"")
            return connection.getresponse().read()
        assert await asyncio.to_thread(fetch) == BODY
    assert kinds == (["_LoopBody"] if use_tls else ["SocketBody"])
