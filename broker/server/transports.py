"""asyncio adapters that connect sockets to `Connection`: plain/TLS stream here, and what
every listener's protocol shares (admission, output flow control); WebSocket in
server/websocket.py, imported at the WebSocket listener's first connection.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final, NamedTuple, cast

from broker.config.loader import Config
from broker.node import Node
from broker.server.admission import ListenerGate
from broker.server.connection import Connection
from broker.server.output import OutputBatch
from broker.server.ratelimit import ClientRates

log = logging.getLogger(__name__)

_HIGH_WATER: Final = 4 * 1024 * 1024


def admitted(node: Node, gate: ListenerGate, transport: asyncio.Transport) -> bool:
    """The listener's limits, before anything is read: a refused socket is aborted."""
    refused = gate.admit(time.monotonic())
    if refused is None:
        return True
    node.stats.refuse(f"{gate.name}.{refused}")
    transport.abort()
    return False


def limit_output(node: Node, transport: asyncio.Transport) -> None:
    """`force_shutdown.max_heap_size` is the transport's high-water mark: past it the
    transport calls pause_writing, which the protocol hands to its Connection (0: no bound,
    and a mark that nothing heeds)."""
    bound = node.config["force_shutdown.max_heap_size"]
    transport.set_write_buffer_limits(high=bound or _HIGH_WATER)


class OutputBound(asyncio.Protocol):
    """The transport's write flow control, handed to the Connection (`limit_output`)."""

    __slots__ = ()
    # Declared here only. A subclass that declares `_connection` again gets, compiled, a
    # class whose collector support visits it twice (a mypyc quirk): the Connection then
    # looks referenced from outside its cycle with the transport and is never freed.
    _connection: Connection | None
    _node: Node

    def pause_writing(self) -> None:
        if self._connection is not None and self._node.config["force_shutdown.max_heap_size"]:
            self._connection.output_backlogged(True)

    def resume_writing(self) -> None:
        if self._connection is not None:
            self._connection.output_backlogged(False)


class MQTTStreamProtocol(OutputBound):
    __slots__ = ("_connection", "_gate", "_node", "_output", "_rates")

    def __init__(self, node: Node, output: OutputBatch, gate: ListenerGate,
                 rates: ClientRates | None = None) -> None:
        self._node = node
        self._output = output
        self._gate = gate
        self._rates = rates
        self._connection = None  # (declared by OutputBound only: see there)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        if not admitted(self._node, self._gate, transport):
            return
        limit_output(self._node, transport)
        self._connection = Connection(self._node, transport, self._output, self._rates)

    def data_received(self, data: bytes) -> None:
        assert self._connection is not None
        self._connection.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        # Let go of the Connection (it holds the transport, which holds us): without the
        # cycle, a closed connection is freed at once, not at the next collection.
        connection, self._connection = self._connection, None
        if connection is not None:
            self._gate.release()
            connection.connection_lost()


class WebSocketOptions(NamedTuple):
    """The WebSocket listener's settings, read once for all its connections. (A NamedTuple:
    a frozen dataclass costs a start ~0.7 ms to build, issue 42.)"""

    path: str
    subprotocols: tuple[str, ...]
    fail_if_no_subprotocol: bool
    handshake_timeout: float

    @classmethod
    def from_config(cls, config: Config) -> "WebSocketOptions":
        prefix = "listeners.ws.default.websocket."
        offered = config[prefix + "supported_subprotocols"].split(",")
        return cls(
            config[prefix + "mqtt_path"], tuple(p.strip() for p in offered if p.strip()),
            config[prefix + "fail_if_no_subprotocol"], config[prefix + "handshake_timeout"],
        )


def websocket_protocols(node: Node, output: OutputBatch, options: WebSocketOptions,
                        gate: ListenerGate, rates: ClientRates | None = None,
                        ) -> Callable[[], asyncio.Protocol]:
    """The WebSocket listener's protocol factory. Its module (wsproto and h11 with it) is
    imported when the first WebSocket client connects: a start that serves MQTT over TCP
    first does not wait for it."""
    def protocol() -> asyncio.Protocol:
        from broker.server.websocket import MQTTWebSocketProtocol

        return MQTTWebSocketProtocol(node, output, options, gate, rates)

    return protocol
