"""SocketBody (broker/backup/body.py): what an export's thread writes to a non-blocking
socket arrives whole and in order, chunked or raw, files included (sendfile), through a
socket that fills up; a cancelled export stops waiting for room; the loop's socket is left
as it was."""

import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from broker.backup import body as body_module
from broker.backup.archive import CHUNK
from broker.backup.body import Cancelled, SocketBody, socket_fd


def _pair() -> tuple[socket.socket, socket.socket]:
    """(the loop's end, non-blocking with a small send buffer: the body waits for room;
    the client's end)."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    ours.setblocking(False)
    return ours, theirs


def _read_all(sock: socket.socket, into: bytearray) -> threading.Thread:
    def read() -> None:
        while data := sock.recv(65536):
            into.extend(data)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def _dechunk(raw: bytes) -> tuple[bytes, list[int]]:
    """The body of a chunked stream without its end marker (the loop writes it), and each
    chunk's length."""
    body, sizes, at = bytearray(), [], 0
    while at < len(raw):
        line_end = raw.index(b"\r\n", at)
        size = int(raw[at:line_end], 16)
        assert size, "an empty chunk would end the body"
        body += raw[line_end + 2:line_end + 2 + size]
        assert raw[line_end + 2 + size:line_end + 4 + size] == b"\r\n"
        sizes.append(size)
        at = line_end + 4 + size
    return bytes(body), sizes


@pytest.mark.parametrize("chunked", [True, False])
def test_what_is_written_and_sent_from_a_file_arrives_in_order(
        tmp_path: Path, chunked: bool) -> None:
    table = tmp_path / "000005.ldb"
    table.write_bytes(os.urandom(2 * CHUNK + 5))
    small, big = os.urandom(100), os.urandom(CHUNK + 3)
    ours, theirs = _pair()
    received = bytearray()
    reader = _read_all(theirs, received)
    body = SocketBody(ours.fileno(), chunked, lambda: False)
    body.write(small)
    body.write(b"")  # nothing (chunked: not the end marker)
    with table.open("rb") as file:
        pieces = list(body.send_file(file.fileno(), table.stat().st_size))
    body.write(memoryview(big))
    body.close()
    assert not os.get_blocking(ours.fileno())  # the loop's descriptor: as it was, and open
    ours.close()
    reader.join(30)
    assert pieces == [CHUNK, CHUNK, 5]
    expected = small + table.read_bytes() + big
    if chunked:
        assert _dechunk(bytes(received)) == (expected, [100, 2 * CHUNK + 5, CHUNK + 3])
    else:
        assert bytes(received) == expected


def test_a_cancelled_export_stops_waiting_for_room(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(body_module, "_POLL_MS", 10)
    ours, theirs = _pair()  # nobody reads: the socket fills up
    polls: list[int] = []

    def stopped() -> bool:
        polls.append(1)
        return len(polls) > 2
    body = SocketBody(ours.fileno(), True, stopped)
    with pytest.raises(Cancelled):
        body.write(os.urandom(4 * CHUNK))
    body.close()
    ours.close()
    theirs.close()


def test_a_client_gone_fails_the_next_send() -> None:
    ours, theirs = _pair()
    theirs.close()
    body = SocketBody(ours.fileno(), True, lambda: False)
    with pytest.raises(OSError):
        body.write(os.urandom(CHUNK))
    body.close()
    ours.close()


class _Transport:
    def __init__(self, sock: socket.socket, **extra: Any) -> None:
        self._extra = {"socket": sock, **extra}
        self.buffered = 0

    def get_extra_info(self, name: str) -> Any:
        return self._extra.get(name)

    def get_write_buffer_size(self) -> int:
        return self.buffered


def test_only_a_plain_socket_with_nothing_buffered_is_handed_over() -> None:
    ours, theirs = _pair()
    plain = _Transport(ours)
    assert socket_fd(plain) == ours.fileno()
    plain.buffered = 10  # the loop still has bytes to send before the thread's
    assert socket_fd(plain) is None
    assert socket_fd(_Transport(ours, sslcontext=object())) is None
    assert socket_fd(None) is None
    ours.close()
    theirs.close()
