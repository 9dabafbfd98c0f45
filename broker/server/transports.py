"""asyncio adapters that connect sockets to `Connection`: plain/TLS stream and WebSocket.

The WebSocket adapter speaks RFC 6455 through wsproto (sans-I/O) and presents the same
write/close surface as a TCP transport, so the MQTT side cannot tell the difference. MQTT
packets may span WebSocket frames and a frame may hold several packets; the decoder copes.
"""

import asyncio
import logging
from typing import Any, Final

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import RemoteProtocolError

from broker.node import Node
from broker.server.connection import Connection
from broker.server.output import OutputBatch

log = logging.getLogger(__name__)

_HIGH_WATER: Final = 4 * 1024 * 1024


class MQTTStreamProtocol(asyncio.Protocol):
    __slots__ = ("_connection", "_node", "_output")

    def __init__(self, node: Node, output: OutputBatch) -> None:
        self._node = node
        self._output = output
        self._connection: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.set_write_buffer_limits(high=_HIGH_WATER)
        self._connection = Connection(self._node, transport, self._output)

    def data_received(self, data: bytes) -> None:
        assert self._connection is not None
        self._connection.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._connection is not None:
            self._connection.connection_lost()


class _WebSocketWriter:
    """What Connection sees as its transport when the client speaks WebSocket."""

    def __init__(self, transport: asyncio.Transport, ws: WSConnection) -> None:
        self._transport = transport
        self._ws = ws

    def write(self, data: bytes) -> None:
        self._transport.write(self._ws.send(BytesMessage(data=data)))

    def close(self) -> None:
        try:
            self._transport.write(self._ws.send(CloseConnection(code=1000)))
        except Exception:  # the peer may already have closed the WebSocket
            log.debug("websocket close frame not sent", exc_info=True)
        self._transport.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()


class MQTTWebSocketProtocol(asyncio.Protocol):
    def __init__(self, node: Node, output: OutputBatch, path: str) -> None:
        self._node = node
        self._output = output
        self._path = path
        self._ws = WSConnection(ConnectionType.SERVER)
        self._transport: asyncio.Transport | None = None
        self._connection: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        assert transport is not None
        try:
            self._ws.receive_data(data)
            for event in self._ws.events():
                self._on_event(transport, event)
        except RemoteProtocolError as error:
            log.info("bad websocket request: %s", error)
            if error.event_hint is not None:
                transport.write(self._ws.send(error.event_hint))
            transport.close()

    def _on_event(self, transport: asyncio.Transport, event: object) -> None:
        if isinstance(event, Request):
            self._accept(transport, event)
        elif isinstance(event, BytesMessage):
            if self._connection is not None:
                self._connection.data_received(bytes(event.data))
        elif isinstance(event, TextMessage):
            # MQTT-6.0.0-1: MQTT over WebSocket uses binary frames only.
            log.info("text frame on MQTT websocket; closing")
            transport.write(self._ws.send(CloseConnection(code=1003)))
            transport.close()
        elif isinstance(event, Ping):
            transport.write(self._ws.send(event.response()))
        elif isinstance(event, CloseConnection):
            if self._ws.state.name == "REMOTE_CLOSING":
                transport.write(self._ws.send(event.response()))
            transport.close()

    def _accept(self, transport: asyncio.Transport, request: Request) -> None:
        path = request.target.split("?", 1)[0]
        if path != self._path:
            transport.write(self._ws.send(RejectConnection(status_code=404)))
            transport.close()
            return
        subprotocol = next(
            (p for p in request.subprotocols if p in ("mqtt", "mqttv3.1", "mqttv5")), None
        )
        transport.write(self._ws.send(AcceptConnection(subprotocol=subprotocol)))
        writer = _WebSocketWriter(transport, self._ws)
        self._connection = Connection(self._node, writer, self._output)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._connection is not None:
            self._connection.connection_lost()
