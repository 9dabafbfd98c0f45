"""SocketUpload (broker/backup/upload.py): a thread reads exactly the body's length from a
non-blocking socket into the pipe, in order, waiting while the pipe is full; a client that
closes early, one that goes silent and a cancelled import each stop it with a reason; the
loop's socket is left open and non-blocking."""

import asyncio
import os
import socket
import threading

import pytest

from broker.backup import pipe as pipe_module
from broker.backup import upload as upload_module
from broker.backup.pipe import Pipe
from broker.backup.upload import SocketUpload, UploadStopped


def _pair() -> tuple[socket.socket, socket.socket]:
    """(the loop's end, non-blocking; the client's end)."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    return ours, theirs


async def _run(upload: SocketUpload, pipe: Pipe) -> str | None:
    """The upload on a thread, the pipe ended after it; why it stopped (None: whole)."""
    def run() -> str | None:
        try:
            upload.run(pipe)
            return None
        except UploadStopped as error:
            return str(error)
        finally:
            pipe.end()
    return await asyncio.get_running_loop().run_in_executor(None, run)


def drain(pipe: Pipe) -> bytes:
    """Blocking: the pipe's bytes as the unpack reads them, till it ends."""
    with pipe.open() as file:
        out = bytearray()
        while data := file.read1(1 << 20):
            out += data
        return bytes(out)


async def test_the_body_arrives_whole_and_what_follows_is_left() -> None:
    body = os.urandom(3 * pipe_module.LIMIT + 5)  # past the pipe's limit: give waits
    ours, theirs = _pair()
    sender = threading.Thread(target=theirs.sendall, args=(body + b"NEXT",), daemon=True)
    sender.start()
    pipe = Pipe(asyncio.get_running_loop())
    loop = asyncio.get_running_loop()
    reading = loop.run_in_executor(None, drain, pipe)
    stopped = await _run(SocketUpload(ours.fileno(), len(body), 5, lambda: False), pipe)
    assert stopped is None
    assert await reading == body
    sender.join(30)
    assert not os.get_blocking(ours.fileno())  # the loop's descriptor: as it was, and open
    assert ours.recv(16) == b"NEXT"  # not the body's: not read
    ours.close()
    theirs.close()


async def test_a_client_that_closes_early_stops_it() -> None:
    ours, theirs = _pair()
    theirs.sendall(b"x" * 1000)
    theirs.close()
    pipe = Pipe(asyncio.get_running_loop())
    stopped = await _run(SocketUpload(ours.fileno(), 5000, 5, lambda: False), pipe)
    assert stopped == "the client closed the connection 4000 bytes short"
    assert pipe.take(10_000, keep=False) == b"x" * 1000
    ours.close()


async def test_a_silent_client_stops_it_after_the_idle_time() -> None:
    ours, theirs = _pair()
    theirs.sendall(b"x" * 10)
    pipe = Pipe(asyncio.get_running_loop())
    stopped = await _run(SocketUpload(ours.fileno(), 100, 0.2, lambda: False), pipe)
    assert stopped == "no byte of the body for 0.2 s (90 bytes short)"
    ours.close()
    theirs.close()


async def test_a_cancelled_import_stops_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upload_module, "_POLL_MS", 10)
    ours, theirs = _pair()
    polls: list[int] = []

    def cancelled() -> bool:
        polls.append(1)
        return len(polls) > 2
    pipe = Pipe(asyncio.get_running_loop())
    stopped = await _run(SocketUpload(ours.fileno(), 100, 0, cancelled), pipe)
    assert stopped == "the import was cancelled"
    ours.close()
    theirs.close()
