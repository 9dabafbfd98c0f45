"""The epoll listener's transports keep asyncio's contract, over real loopback sockets:
buffering with flow control, close after the buffer drains, half-close, abort, paused
reading, the peer's EOF, and a closed listener whose connections go on."""

import asyncio
import os
import socket
from collections.abc import AsyncIterator

import pytest

from broker.server.reactor import Server, StreamTransport, create_server


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: StreamTransport | None = None
        self.data = bytearray()
        self.events: list[str] = []
        self.lost: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future())
        self.received = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, StreamTransport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.received.set()

    def eof_received(self) -> None:
        self.events.append("eof")

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.events.append("lost")
        self.lost.set_result(exc)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Server, list[Recorder]]]:
    protocols: list[Recorder] = []

    def factory() -> Recorder:
        protocols.append(Recorder())
        return protocols[-1]

    server = await create_server(asyncio.get_running_loop(), factory, "127.0.0.1", 0)
    try:
        yield server, protocols
    finally:
        server.close()
        for protocol in protocols:
            if protocol.transport is not None:
                protocol.transport.abort()


async def connect(server: Server, protocols: list[Recorder]) -> tuple[
        asyncio.StreamReader, asyncio.StreamWriter, Recorder, StreamTransport]:
    """A client, and the server side's protocol and transport."""
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while not protocols or protocols[-1].transport is None:
        await asyncio.sleep(0)  # the server accepts on the loop's next pass
    transport = protocols[-1].transport
    assert transport is not None
    return reader, writer, protocols[-1], transport


async def test_a_peer_that_does_not_read_pauses_the_writer_until_it_drains(served) -> None:
    server, protocols = served
    reader, writer, protocol, transport = await connect(server, protocols)
    transport.set_write_buffer_limits(high=64 * 1024)
    chunk = bytes(range(256)) * 256  # 64 KiB
    sent = 0
    while "pause" not in protocol.events:  # until the kernel's buffers are full, then ours
        transport.write(chunk)
        sent += len(chunk)
        assert sent < 64 * 1024 * 1024
    assert transport.get_write_buffer_size() > 64 * 1024
    got = await reader.readexactly(sent)
    assert got == chunk * (sent // len(chunk))
    assert protocol.events == ["pause", "resume"]
    assert transport.get_write_buffer_size() == 0
    writer.close()


async def test_close_sends_what_is_buffered_then_the_fin(served) -> None:
    server, protocols = served
    reader, writer, protocol, transport = await connect(server, protocols)
    payload = b"x" * (8 * 1024 * 1024)  # more than the socket buffers take at once
    transport.write(payload)
    assert transport.get_write_buffer_size() > 0
    transport.close()
    transport.close()
    assert transport.is_closing()
    assert await reader.read() == payload  # everything, then EOF
    assert await protocol.lost is None
    assert protocol.events.count("lost") == 1
    writer.close()


async def test_write_eof_half_closes_and_input_still_arrives(served) -> None:
    server, protocols = served
    reader, writer, protocol, transport = await connect(server, protocols)
    transport.write(b"last words")
    transport.write_eof()
    with pytest.raises(RuntimeError):
        transport.write(b"more")
    assert await reader.read() == b"last words"
    writer.write(b"still talking")
    await writer.drain()
    await protocol.received.wait()
    assert protocol.data == b"still talking"
    writer.close()  # our side sees the EOF: the transport closes
    assert await protocol.lost is None
    assert protocol.events == ["eof", "lost"]


async def test_paused_reading_holds_input_in_the_socket(served) -> None:
    server, protocols = served
    _, writer, protocol, transport = await connect(server, protocols)
    transport.pause_reading()
    assert not transport.is_reading()
    writer.write(b"waits")
    await writer.drain()
    # Loopback delivers on write: once a second connection's later input has arrived, the
    # epoll has been polled with this input readable.
    _, other_writer, other, _ = await connect(server, protocols)
    other_writer.write(b"ping")
    await other.received.wait()
    other_writer.close()
    assert protocol.data == b""
    transport.resume_reading()
    await protocol.received.wait()
    assert protocol.data == b"waits"
    writer.close()


async def test_abort_resets_at_once_and_reports_once(served) -> None:
    server, protocols = served
    reader, writer, protocol, transport = await connect(server, protocols)
    assert transport.get_extra_info("peername") == writer.get_extra_info("sockname")
    transport.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    transport.write(b"never mind")
    transport.abort()
    transport.abort()
    assert await protocol.lost is None
    assert protocol.events == ["lost"]
    with pytest.raises(ConnectionResetError):
        await reader.read()
    writer.close()


async def test_a_reset_by_the_peer_reaches_the_protocol(served) -> None:
    server, protocols = served
    _, writer, protocol, _ = await connect(server, protocols)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()
    assert isinstance(await protocol.lost, ConnectionResetError)


async def test_a_closed_listener_refuses_new_clients_and_keeps_its_connections(
    served,
) -> None:
    server, protocols = served
    port = server.sockets[0].getsockname()[1]
    reader, writer, protocol, transport = await connect(server, protocols)
    server.close()
    await server.wait_closed()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)
    transport.write(b"still here")
    assert await reader.readexactly(10) == b"still here"
    writer.close()
    assert await protocol.lost is None
    assert server.reactor.transports == {}


def _watched(server: Server) -> set[int]:
    """The descriptors the reactor's epoll holds, as the kernel lists them."""
    epoll_fd = server.reactor._epoll.fileno()
    with open(f"/proc/self/fdinfo/{epoll_fd}") as info:
        return {int(line.split()[1]) for line in info if line.startswith("tfd:")}


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


async def test_thousands_of_connections_leave_no_descriptor_open_or_watched(served) -> None:
    """A transport leaves the epoll by its descriptor's close, without an EPOLL_CTL_DEL:
    every descriptor is closed, and none is left in the epoll."""
    server, protocols = served
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)  # what a first one makes
    while not protocols or protocols[0].transport is None:
        await asyncio.sleep(0)
    protocols[0].transport.abort()
    await protocols[0].lost
    writer.close()
    await writer.wait_closed()
    before = _open_fds()

    async def one(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"x")
        while len(protocols) <= n or not protocols[n].data:
            await asyncio.sleep(0)
        if n % 2:
            protocols[n].transport.close()  # ours closes first
            assert await reader.read() == b""
        writer.close()
        await protocols[n].lost

    for first in range(1, 2001, 50):
        await asyncio.gather(*(one(n) for n in range(first, first + 50)))
    assert len(protocols) == 2001
    assert all(p.events[-1] == "lost" for p in protocols)
    assert server.reactor.transports == {}
    assert _watched(server) == set()
    assert _open_fds() == before


async def test_a_client_given_a_closed_connections_descriptor_at_once_is_served(served) -> None:
    server, protocols = served
    reader, writer, protocol, transport = await connect(server, protocols)
    fd = transport._fd
    transport.close()
    assert await protocol.lost is None
    assert fd not in _watched(server)
    assert await reader.read() == b""
    writer.close()
    await writer.wait_closed()
    # The kernel hands out the lowest free number: the next accepted client gets `fd`
    # unless the client's own socket (this process's too) took it first.
    clients = []
    while True:
        reader, writer, second, transport = await connect(server, protocols)
        clients.append(writer)
        if transport._fd == fd or len(clients) == 3:
            break
    assert transport._fd == fd
    writer.write(b"hello")
    await second.received.wait()
    assert second.data == b"hello"
    transport.write(b"back")
    assert await reader.readexactly(4) == b"back"
    for writer in clients:
        writer.close()
    assert await second.lost is None
    assert protocol.events == ["lost"]  # the first protocol heard nothing of the others
