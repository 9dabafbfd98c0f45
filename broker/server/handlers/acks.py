"""PUBACK / PUBREC / PUBREL / PUBCOMP: completing QoS 1 and 2 flows in both directions."""

from typing import TYPE_CHECKING, Final

from broker.mqtt.codec import encode_ack
from broker.mqtt.constants import FIRST_FAILURE_CODE, PUBCOMP_BYTE, PUBREL_BYTE, ReasonCode
from broker.mqtt.packets import Puback, Pubcomp, Pubrec, Pubrel

if TYPE_CHECKING:
    from broker.server.connection import Connection

_NOT_FOUND: Final = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND


def handle_puback(conn: "Connection", packet: Puback) -> None:
    session = conn.session
    assert session is not None
    delivery = session.inflight.get(packet.packet_id)
    if delivery is not None and delivery.qos == 1:
        session.finish(packet.packet_id)
        conn.drain()


def handle_pubrec(conn: "Connection", packet: Pubrec) -> None:
    session = conn.session
    assert session is not None
    delivery = session.inflight.get(packet.packet_id)
    if delivery is None or delivery.qos != 2:
        conn.send(encode_ack(PUBREL_BYTE, packet.packet_id, _NOT_FOUND, conn.version))
        return
    if packet.reason_code >= FIRST_FAILURE_CODE:
        # The receiver refused the message: the flow ends here (MQTT 5.0 section 4.3.3).
        session.finish(packet.packet_id)
        conn.drain()
        return
    conn.send_when(session.released(packet.packet_id),
                   encode_ack(PUBREL_BYTE, packet.packet_id, 0, conn.version))


def handle_pubrel(conn: "Connection", packet: Pubrel) -> None:
    session = conn.session
    assert session is not None
    if session.rel_arrived(packet.packet_id):
        conn.send_when(None, encode_ack(PUBCOMP_BYTE, packet.packet_id, 0, conn.version))
    else:
        # Through send_when too: every PUBCOMP gives the client back send quota.
        conn.send_when(None, encode_ack(PUBCOMP_BYTE, packet.packet_id, _NOT_FOUND, conn.version))


def handle_pubcomp(conn: "Connection", packet: Pubcomp) -> None:
    session = conn.session
    assert session is not None
    if packet.packet_id in session.awaiting_comp:
        session.finish(packet.packet_id)
        conn.drain()
