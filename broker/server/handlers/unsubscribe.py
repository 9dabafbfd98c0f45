"""UNSUBSCRIBE: remove each filter; v5 reports per filter whether it existed."""

from typing import TYPE_CHECKING

from broker.mqtt.constants import ReasonCode
from broker.mqtt.errors import MQTTError
from broker.mqtt.packets import Unsuback, Unsubscribe
from broker.mqtt.topic import parse_shared

if TYPE_CHECKING:
    from broker.server.connection import Connection


def handle_unsubscribe(conn: "Connection", packet: Unsubscribe) -> None:
    session = conn.session
    assert session is not None
    codes: list[int] = []
    for key in packet.topic_filters:
        try:
            group, topic_filter = parse_shared(key)
        except MQTTError:
            codes.append(ReasonCode.TOPIC_FILTER_INVALID)
            continue
        if session.subscriptions.pop(key, None) is None:
            codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
            continue
        conn.node.router.unsubscribe(session.client_id, topic_filter, group)
        codes.append(ReasonCode.SUCCESS)
    conn.send_packet(Unsuback(packet.packet_id, codes))
