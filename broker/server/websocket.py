"""MQTT over WebSocket (RFC 6455, through wsproto, sans-I/O): the adapter presents the same
write/close/pause surface as a TCP transport, so the MQTT side cannot tell the difference.
MQTT packets may span WebSocket frames and a frame may hold several packets; the decoder
copes. The upgrade must name a supported subprotocol (MQTT 5.0 section 6, EMQX's
`fail_if_no_subprotocol`) and complete within `handshake_timeout`.

A module of its own, imported at the listener's first connection (server/app.py): wsproto
and h11 are a tenth of the modules a start imports, and no client over TCP needs them.
"""

import asyncio
import logging
from typing import Any, Final, cast

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

from broker.mqtt.codec import Decoder
from broker.mqtt.errors import PacketTooLarge
from broker.node import Node
from broker.server.admission import ListenerGate
from broker.server.connection import Connection
from broker.server.output import OutputBatch
from broker.server.ratelimit import ClientRates
from broker.server.transports import OutputBound, WebSocketOptions, admitted, limit_output

log = logging.getLogger(__name__)

_NORMAL_CLOSURE: Final = 1000
_MESSAGE_TOO_BIG: Final = 1009
_UNSUPPORTED_DATA: Final = 1003


class _WebSocketWriter:
    """What Connection sees as its transport when the client speaks WebSocket."""

    def __init__(self, transport: asyncio.Transport, ws: WSConnection) -> None:
        self._transport = transport
        self._ws = ws
        self.decoder: Decoder | None = None  # the connection's, for the close code

    def write(self, data: bytes) -> None:
        self._transport.write(self._ws.send(BytesMessage(data=data)))

    def _send_close_frame(self) -> None:
        decoder = self.decoder
        too_big = decoder is not None and isinstance(decoder.error, PacketTooLarge)
        try:
            code = _MESSAGE_TOO_BIG if too_big else _NORMAL_CLOSURE
            self._transport.write(self._ws.send(CloseConnection(code=code)))
        except Exception:  # the peer may already have closed the WebSocket
            log.debug("websocket close frame not sent", exc_info=True)

    def close(self) -> None:
        self._send_close_frame()
        self._transport.close()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        """The Close frame, then the TCP half-close; the socket goes when the client's
        Close frame answers (`MQTTWebSocketProtocol._on_event`) or the peer closes."""
        self._send_close_frame()
        self._transport.write_eof()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def abort(self) -> None:
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()


class MQTTWebSocketProtocol(OutputBound):
    def __init__(self, node: Node, output: OutputBatch, options: WebSocketOptions,
                 gate: ListenerGate, rates: ClientRates | None = None) -> None:
        self._node = node
        self._output = output
        self._options = options
        self._gate = gate
        self._rates = rates
        self._admitted = False
        self._ws = WSConnection(ConnectionType.SERVER)
        self._transport: asyncio.Transport | None = None
        self._connection = None  # (declared by OutputBound only: see there)
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self._admitted = admitted(self._node, self._gate, transport)
        if not self._admitted:
            return
        limit_output(self._node, transport)
        self._transport = transport
        if self._options.handshake_timeout:
            self._timer = asyncio.get_running_loop().call_later(
                self._options.handshake_timeout, self._handshake_timeout)

    def _handshake_timeout(self) -> None:
        """The upgrade request did not arrive in time: a silent client, or one sending its
        headers a byte at a time, would otherwise hold the socket for as long as it likes."""
        self._timer = None
        transport = self._transport
        if self._connection is None and transport is not None and not transport.is_closing():
            self._node.stats.time_out("ws_handshake")
            log.info("closing %s: no WebSocket upgrade request within %.1f s",
                     transport.get_extra_info("peername"), self._options.handshake_timeout)
            transport.close()

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        assert transport is not None
        if self._connection is not None and self._connection.closed:
            return  # drained while the close lingers: no frame is answered after our Close
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
            transport.write(self._ws.send(CloseConnection(code=_UNSUPPORTED_DATA)))
            transport.close()
        elif isinstance(event, Ping):
            transport.write(self._ws.send(event.response()))
        elif isinstance(event, CloseConnection):
            if self._ws.state.name == "REMOTE_CLOSING":
                transport.write(self._ws.send(event.response()))
            transport.close()

    def _accept(self, transport: asyncio.Transport, request: Request) -> None:
        self._cancel_timer()
        options = self._options
        path = request.target.split("?", 1)[0]
        if path != options.path:
            self._reject(transport, 404)
            return
        subprotocol = next((p for p in request.subprotocols if p in options.subprotocols), None)
        if subprotocol is None and options.fail_if_no_subprotocol:
            log.info("refusing a WebSocket upgrade from %s: subprotocols %s, none of %s",
                     transport.get_extra_info("peername"), request.subprotocols,
                     options.subprotocols)
            self._reject(transport, 400)
            return
        transport.write(self._ws.send(AcceptConnection(subprotocol=subprotocol)))
        writer = _WebSocketWriter(transport, self._ws)
        self._connection = Connection(self._node, writer, self._output, self._rates)
        writer.decoder = self._connection.decoder

    def _reject(self, transport: asyncio.Transport, status: int) -> None:
        transport.write(self._ws.send(RejectConnection(status_code=status)))
        transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._admitted:
            self._gate.release()
        connection, self._connection = self._connection, None  # (as MQTTStreamProtocol's)
        if connection is not None:
            connection.connection_lost()
