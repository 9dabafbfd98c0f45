"""The load generator's socket reads: one buffer per process, reused by every read, so what a
read returns must be its own bytes, not a window on a buffer the next read overwrites."""

import socket

from bench.loadgen import Inbox


def test_each_read_returns_its_own_copy_of_what_arrived() -> None:
    sender, receiver = socket.socketpair()
    with sender, receiver:
        inbox = Inbox(size=8)
        sender.sendall(b"first")
        first = inbox.recv(receiver)
        sender.sendall(b"second, longer")
        second, rest = inbox.recv(receiver), inbox.recv(receiver)
        assert (first, second, rest) == (b"first", b"second, ", b"longer")
        assert type(first) is bytes  # the codec's Decoder (the slow path) takes bytes
        sender.close()
        assert inbox.recv(receiver) == b""  # the peer's close, as recv() says it
