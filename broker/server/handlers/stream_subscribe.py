"""SUBSCRIBE `$stream/<name>[/<filter>]`: a replay from Durable Storage
(broker/session/durable/streams.py).

The subscription is a durable session's like any other once its start time is set: the
offset the client named (user property `stream-offset`: `earliest`, `latest` or a UTC
timestamp in microseconds; `earliest` when absent), no earlier than the stream's creation.
A memory session has no reading path over Durable Storage, so it is refused (0x83), as is
a bad offset; a stream that does not exist, or whose filter is not the one named, is 0x8F.
"""

from typing import TYPE_CHECKING, Final

from broker.mqtt.constants import PropertyId, ReasonCode
from broker.mqtt.errors import MQTTError
from broker.mqtt.packets import Properties
from broker.session.session import Session

if TYPE_CHECKING:
    from broker.server.connection import Connection

OFFSET_PROPERTY: Final = "stream-offset"


def _check(conn: "Connection", session: Session) -> None:
    if conn.node.streams is None:
        raise MQTTError("$stream subscriptions need durable_sessions.enable",
                        ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
    if not session.durable:
        raise MQTTError("a $stream subscription needs a durable session (Session Expiry"
                        " Interval above 0)", ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)


def stream_target(conn: "Connection", session: Session, key: str) -> str:
    """The topic filter the subscription would read, which authorization is checked on."""
    _check(conn, session)
    assert conn.node.streams is not None
    return conn.node.streams.target(key)


def start_stream(conn: "Connection", session: Session, key: str,
                 properties: Properties) -> None:
    """Sets where a new `$stream` subscription starts reading (one the session has goes on
    from its position: a repeated SUBSCRIBE does not rewind it), creating the stream from
    `$stream/<name>/<filter>` when `streams.auto_create` allows."""
    streams = conn.node.streams
    assert streams is not None
    offset = None
    for name, value in properties.get(PropertyId.USER_PROPERTY, ()):
        if name == OFFSET_PROPERTY:
            offset = value
    since = streams.resolve(key, offset, conn.node.config["streams.auto_create"])[1]
    session.start_at(key, since)


def suback_properties(conn: "Connection", codes: list[int], reasons: list[str]) -> Properties:
    """The SUBACK's Reason String saying why `$stream` filters were refused, left out when
    the packet would then exceed the client's Maximum Packet Size (MQTT-3.1.2-25)."""
    if not reasons:
        return {}
    reason = "; ".join(reasons)[:512]
    size = len(reason.encode()) + len(codes) + 16  # fixed header, identifier, properties
    if conn.client_max_packet is not None and size > conn.client_max_packet:
        return {}
    return {PropertyId.REASON_STRING: reason}
