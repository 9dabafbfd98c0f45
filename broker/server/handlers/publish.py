"""PUBLISH from a client: topic aliases, limits, payload format, QoS 0/1/2 acknowledgement."""

import asyncio
from typing import TYPE_CHECKING, Final

from broker.auth.authorization import REFUSAL_CODES, Verdict
from broker.mqtt.codec import encode_ack
from broker.mqtt.constants import MQTT_5, PUBACK_BYTE, PUBREC_BYTE, PropertyId, ReasonCode
from broker.mqtt.errors import MQTTError, ProtocolError
from broker.mqtt.packets import Publish
from broker.mqtt.topic import validate_topic_name
from broker.server.handlers.authorize import verdict_later, verdict_now
from broker.session.message import message_from_publish, payload_format_ok
from broker.sys_topics import is_sys_topic

if TYPE_CHECKING:
    from broker.server.connection import Connection

_ALIAS: Final = PropertyId.TOPIC_ALIAS
_SUB_IDS: Final = PropertyId.SUBSCRIPTION_IDENTIFIER
_RESPONSE_TOPIC: Final = PropertyId.RESPONSE_TOPIC
_SYS_PUBLISH: Final = "sys_topics.allow_client_publish"


def _resolve_alias(conn: "Connection", packet: Publish) -> str:
    alias = packet.properties.pop(_ALIAS)
    if alias > conn.node.limits.max_topic_alias:
        raise MQTTError(f"topic alias {alias} above our maximum", ReasonCode.TOPIC_ALIAS_INVALID)
    if packet.topic:
        conn.in_aliases[alias] = packet.topic
        return packet.topic
    topic = conn.in_aliases.get(alias)
    if topic is None:
        raise ProtocolError(f"topic alias {alias} was never set")
    return topic


def _not_authorized(conn: "Connection", qos: int, packet_id: int, drop: str,
                    code: int = ReasonCode.NOT_AUTHORIZED) -> None:
    """Refused, not routed. v3.1.1 has no way to say no: its QoS 1/2 acknowledgement carries
    no reason, and the message is dropped all the same."""
    conn.stats.drop(drop)
    if qos:
        conn.send_when(None, encode_ack(PUBACK_BYTE if qos == 1 else PUBREC_BYTE, packet_id,
                                        code, conn.version))


def _refused(conn: "Connection", verdict: Verdict, topic: str, qos: int,
             packet_id: int) -> None:
    """Denied (0x87, or the connection ends with `deny_action = disconnect`), or not
    decided because the HTTP service could not be asked (0x97) or failed (0x80)."""
    if verdict is Verdict.DENY and conn.node.security.disconnect_on_deny:
        raise MQTTError(f"not authorized to publish to {topic!r}", ReasonCode.NOT_AUTHORIZED)
    drop = "not_authorized" if verdict is Verdict.DENY else f"authorization_{verdict.value}"
    _not_authorized(conn, qos, packet_id, drop, REFUSAL_CODES[verdict])


def handle_publish(conn: "Connection", packet: Publish) -> None:
    limits = conn.node.limits
    qos = packet.qos
    topic = packet.topic
    packet_id = packet.packet_id or 0  # QoS 1 and 2 always carry one (the decoder checks)
    props = packet.properties
    if props:
        if _ALIAS in props:
            topic = _resolve_alias(conn, packet)
        if _SUB_IDS in props:
            # MQTT-3.3.4-6: only the server puts Subscription Identifiers on a PUBLISH.
            raise ProtocolError("PUBLISH from a client carries a Subscription Identifier")
        response_topic = props.get(_RESPONSE_TOPIC)
        if response_topic is not None:
            validate_topic_name(response_topic)
    if qos > limits.max_qos:
        raise MQTTError(f"QoS {qos} not supported", ReasonCode.QOS_NOT_SUPPORTED)
    if packet.retain and not limits.retain_available:
        raise MQTTError("retain not supported", ReasonCode.RETAIN_NOT_SUPPORTED)
    if topic.count("/") >= limits.max_topic_levels:
        raise MQTTError("too many topic levels", ReasonCode.TOPIC_NAME_INVALID)
    if qos and conn.version == MQTT_5:
        # MQTT 5.0 section 4.9: a client keeps at most our Receive Maximum of QoS 1/2
        # PUBLISHes unacknowledged. (3.1.1 has no such rule: a client that sends faster
        # than storage writes is paused by `Connection.send_when` instead.)
        conn.incoming_unacked += 1
        if conn.incoming_unacked > limits.max_inflight:
            raise MQTTError("more unacknowledged QoS 1/2 PUBLISHes than Receive Maximum",
                            ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
    stats = conn.stats
    stats.messages_received[qos] += 1
    if topic.startswith("$SYS") and is_sys_topic(topic) and not conn.node.config[_SYS_PUBLISH]:
        # MQTT 4.7.2: `$` topics are the server's.
        return _not_authorized(conn, qos, packet_id, "sys_topic_denied")
    if conn.acl_cache is not None:
        verdict = verdict_now(conn, "publish", topic, qos, packet.retain)
        if verdict is None:  # the HTTP service is asked; the client's next packets wait
            conn.hold_input(asyncio.get_running_loop().create_task(
                _publish_when_decided(conn, packet, topic, packet_id)))
            return
        if verdict is not Verdict.ALLOW:
            return _refused(conn, verdict, topic, qos, packet_id)
    _accept(conn, packet, topic, packet_id)


async def _publish_when_decided(conn: "Connection", packet: Publish, topic: str,
                                packet_id: int) -> None:
    verdict = await verdict_later(conn, "publish", topic, packet.qos, packet.retain)
    if conn.closed:
        return
    if verdict is Verdict.ALLOW:
        _accept(conn, packet, topic, packet_id)
    else:
        _refused(conn, verdict, topic, packet.qos, packet_id)


def _accept(conn: "Connection", packet: Publish, topic: str, packet_id: int) -> None:
    """An authorized PUBLISH: routed and acknowledged."""
    limits, stats, props, qos = conn.node.limits, conn.stats, packet.properties, packet.qos
    if props and not payload_format_ok(packet.payload, props):
        if qos == 0:
            raise MQTTError("payload is not UTF-8", ReasonCode.PAYLOAD_FORMAT_INVALID)
        stats.drop("payload_format_invalid")
        conn.send_when(None, encode_ack(PUBACK_BYTE if qos == 1 else PUBREC_BYTE, packet_id,
                                        ReasonCode.PAYLOAD_FORMAT_INVALID, conn.version))
        return

    session = conn.session
    assert session is not None
    if qos == 2 and packet_id in session.awaiting_rel:
        # A DUP of a QoS 2 message we already own: acknowledge again, never route twice.
        conn.send_when(None, encode_ack(PUBREC_BYTE, packet_id, 0, conn.version))
        return
    if qos == 2:
        limit = limits.max_inflight if conn.version == MQTT_5 else limits.max_awaiting_rel
        if limit and len(session.awaiting_rel) >= limit:
            raise MQTTError("too many QoS 2 messages awaiting PUBREL",
                            ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
    message = message_from_publish(
        topic, packet.payload, qos, packet.retain, conn.client_id, props
    )
    matched, stored = conn.node.publish(message)
    if qos == 0:
        return
    reason = (
        ReasonCode.SUCCESS if matched or conn.version != MQTT_5
        else ReasonCode.NO_MATCHING_SUBSCRIBERS
    )
    if qos == 1:
        conn.send_when(stored, encode_ack(PUBACK_BYTE, packet_id, reason, conn.version),
                       len(packet.payload))
        return
    remembered = session.rel_awaited(packet_id)
    if remembered is not None:
        # (gather's list of results is never looked at: only its completion)
        stored = remembered if stored is None else asyncio.gather(  # type: ignore[assignment]
            stored, remembered)
    conn.send_when(stored, encode_ack(PUBREC_BYTE, packet_id, reason, conn.version),
                   len(packet.payload))
