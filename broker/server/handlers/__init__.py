"""One handler per client-to-server packet type, found by the packet's name."""

from collections.abc import Callable
from typing import Any

from broker.mqtt.constants import PacketType
from broker.server.handlers.acks import handle_puback, handle_pubcomp, handle_pubrec, handle_pubrel
from broker.server.handlers.auth import handle_auth
from broker.server.handlers.connect import handle_connect
from broker.server.handlers.disconnect import handle_disconnect, handle_pingreq
from broker.server.handlers.publish import handle_publish
from broker.server.handlers.subscribe import handle_subscribe
from broker.server.handlers.unsubscribe import handle_unsubscribe

HANDLERS: dict[PacketType, Callable[[Any, Any], None]] = {
    PacketType.CONNECT: handle_connect,
    PacketType.PUBLISH: handle_publish,
    PacketType.PUBACK: handle_puback,
    PacketType.PUBREC: handle_pubrec,
    PacketType.PUBREL: handle_pubrel,
    PacketType.PUBCOMP: handle_pubcomp,
    PacketType.SUBSCRIBE: handle_subscribe,
    PacketType.UNSUBSCRIBE: handle_unsubscribe,
    PacketType.PINGREQ: handle_pingreq,
    PacketType.DISCONNECT: handle_disconnect,
    PacketType.AUTH: handle_auth,
}
