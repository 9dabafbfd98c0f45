"""A closed connection leaves memory when its client goes, by reference counting alone.

Its Connection, transport and protocol refer to one another; left as a cycle, a closed
connection waited for a collection, and in the compiled build for ever: the protocol's
collector support visited its Connection twice (a mypyc quirk of an attribute declared
again in a subclass), so the collector took the Connection for referenced from outside.
100,000 sessions that connected once and left then held 2 KiB of RSS each, not 600 B.
"""

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config.loader import load_config
from broker.mqtt.codec import encode
from broker.mqtt.packets import Connect, Disconnect
from broker.server import app
from broker.server.connection import Connection

V4 = 4


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[app.BrokerApp]:
    config = load_config(None, [
        "listeners.tcp.default.bind=127.0.0.1:0", "listeners.ws.default.bind=127.0.0.1:0",
        "dashboard.listeners.http.bind=127.0.0.1:0", f"node.data_dir={tmp_path / 'data'}",
        "rpc.listen_address=127.0.0.1", "rpc.tcp_server_port=0"])
    started = app.BrokerApp(config)
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


def _connections() -> list[Connection]:
    """This module's (other tests' may be alive too)."""
    return [o for o in gc.get_objects()
            if isinstance(o, Connection) and o.client_id.startswith("release-")]


async def _connected(port: int, client_id: str) -> tuple[asyncio.StreamReader,
                                                         asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(client_id=client_id, protocol_level=V4, clean_start=False),
                        V4))
    assert (await reader.readexactly(4))[:1] == b"\x20"  # CONNACK
    return reader, writer


async def test_the_collector_sees_the_connection_referenced_once_by_its_protocol(
        broker: app.BrokerApp) -> None:
    _, writer = await _connected(broker.ports["tcp"], "release-traverse")
    [connection] = _connections()
    holders = gc.get_referrers(connection)
    assert holders, "nothing holds the live connection"
    for holder in holders:
        assert gc.get_referents(holder).count(connection) == 1, type(holder)
    writer.close()
    await writer.wait_closed()


async def test_a_connection_closed_is_freed_without_a_collection(
        broker: app.BrokerApp) -> None:
    port = broker.ports["tcp"]
    gc.collect()
    gc.disable()
    try:
        for i in range(3):
            reader, writer = await _connected(port, f"release-{i}")
            if i % 2:
                writer.write(encode(Disconnect(), V4))  # the broker closes after it
                assert await reader.read() == b""
            writer.close()  # (or the client goes first)
            await writer.wait_closed()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while _connections() and loop.time() < deadline:
            await asyncio.sleep(0.01)  # the broker's side closes on its next reads
        assert _connections() == []
    finally:
        gc.enable()
