"""UNSUBSCRIBE: remove each filter; v5 reports per filter whether it existed.

Applied in time slices (`handle_in_slices`), as SUBSCRIBE is.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from broker.mqtt.codec import encode
from broker.mqtt.constants import ReasonCode
from broker.mqtt.errors import MQTTError
from broker.mqtt.packets import Unsuback, Unsubscribe
from broker.mqtt.topic import parse_shared
from broker.server.handlers.sliced import handle_in_slices
from broker.session.session import Session

if TYPE_CHECKING:
    from broker.server.connection import Connection


def handle_unsubscribe(conn: "Connection", packet: Unsubscribe) -> None:
    session = conn.session
    assert session is not None
    handle_in_slices(conn, _unsubscribe(conn, session, packet))


def _unsubscribe(conn: "Connection", session: Session, packet: Unsubscribe) -> Iterator[None]:
    node = conn.node
    codes: list[int] = []
    for key in packet.topic_filters:
        yield
        try:
            group, topic_filter = parse_shared(key)
        except MQTTError:
            codes.append(ReasonCode.TOPIC_FILTER_INVALID)
            continue
        if key not in session.subscriptions:
            codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
            continue
        if session.unsubscribe(key):
            node.remove_durable_filter(session.client_id, key)
        else:
            node.router.unsubscribe(session.client_id, topic_filter, group)
        codes.append(ReasonCode.SUCCESS)
    # Behind a durable SUBACK still waiting for the disk, as the requests came.
    conn.send_when(None, encode(Unsuback(packet.packet_id, codes), conn.version))
