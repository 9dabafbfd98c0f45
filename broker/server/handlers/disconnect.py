"""DISCONNECT and PINGREQ from a client."""

from typing import TYPE_CHECKING

from broker.mqtt.codec import encode
from broker.mqtt.constants import PropertyId, ReasonCode
from broker.mqtt.errors import ProtocolError
from broker.mqtt.packets import Disconnect, Pingreq, Pingresp
from broker.session.manager import granted_expiry

if TYPE_CHECKING:
    from broker.server.connection import Connection


def handle_disconnect(conn: "Connection", packet: Disconnect) -> None:
    session = conn.session
    assert session is not None
    expiry = packet.properties.get(PropertyId.SESSION_EXPIRY_INTERVAL)
    if expiry is not None:
        if session.expiry_interval == 0 and expiry != 0:
            # MQTT-3.14.2-2: a session that was to end at disconnect cannot be extended now.
            raise ProtocolError("Session Expiry Interval set on DISCONNECT after 0 in CONNECT")
        session.expiry_interval = granted_expiry(
            expiry, conn.node.config["mqtt.max_session_expiry_interval"]
        )
    if packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
        conn.will = None
    conn.close(linger=False)


def handle_pingreq(conn: "Connection", packet: Pingreq) -> None:
    # Behind any acknowledgement still waiting for the disk (a durable SUBACK): answers
    # leave in the order their requests came.
    conn.send_when(None, encode(Pingresp(), conn.version))

