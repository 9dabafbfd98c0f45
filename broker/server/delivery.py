"""Outgoing PUBLISHes of one connection: the client's in-flight window (its Receive
Maximum) and the session's queue behind it, the ACL asked again per message, and the
encoding, shared between subscribers where nothing per connection differs (wire.py).

Functions of the connection rather than its methods: `Connection` keeps the input side and
the lifecycle, and calls these for what leaves (its `deliver`, `drain`, `resend_inflight`,
which sessions and handlers use).
"""

from typing import TYPE_CHECKING, Final

from broker.auth.acl import Access
from broker.mqtt.codec import encode_publish
from broker.mqtt.constants import MQTT_5, PropertyId
from broker.mqtt.packets import Pubrel
from broker.server.wire import shared_publish
from broker.session.session import Delivery, Session

if TYPE_CHECKING:
    from broker.server.connection import Connection

# A client that reads slower than it is sent to: past this much unsent data, QoS 0 messages
# for it are dropped (and counted) rather than held in broker memory without bound.
QOS0_DROP_BUFFER: Final = 8 * 1024 * 1024
_SUB_IDS: Final = PropertyId.SUBSCRIPTION_IDENTIFIER
_TOPIC_ALIAS: Final = PropertyId.TOPIC_ALIAS


def deliver(conn: "Connection", delivery: Delivery) -> None:
    """A message for this client: send now, or queue when the in-flight window is full."""
    message = delivery.message
    if message.expires_at is not None and message.is_expired():
        conn.stats.drop("expired")
        return
    if conn.acl_cache is not None and not may_read(conn, delivery):
        return
    if delivery.qos == 0:
        if conn.transport.get_write_buffer_size() > QOS0_DROP_BUFFER:
            conn.stats.drop("slow_consumer")
            return
        send_publish(conn, delivery, None, False)
        return
    session = conn.session
    assert session is not None
    if session.queued or len(session.inflight) >= conn.send_window:
        lost = session.enqueue(delivery)
        if lost:
            conn.stats.drop(lost)
        return
    _send_inflight(conn, session, delivery)


def may_read(conn: "Connection", delivery: Delivery) -> bool:
    """The ACL is asked again for every message delivered: a subscription to a broad
    filter must not carry a topic the client may not read. A refused QoS 1/2 message
    counts as done (a durable session does not keep it pending for ever)."""
    cache = conn.acl_cache
    topic = delivery.message.topic
    if (cache is not None and cache.generation == conn.node.security.generation
            and cache.read.get(topic)) or conn.authorized(topic, Access.READ):
        return True
    conn.stats.drop("not_authorized")
    if delivery.qos and conn.session is not None:
        conn.session.completed(delivery)
    return False


def _send_inflight(conn: "Connection", session: Session, delivery: Delivery) -> None:
    """QoS 1/2: take a packet ID, remember the delivery until acknowledged, send it."""
    packet_id = delivery.packet_id or session.next_packet_id()
    session.inflight[packet_id] = delivery
    send_publish(conn, delivery, packet_id, delivery.sent)


def drain(conn: "Connection") -> None:
    """Moves queued messages into the in-flight window as it opens up."""
    session = conn.session
    if session is None or not session.queued:
        return
    queue, inflight = session.queue, session.inflight
    while queue and len(inflight) < conn.send_window:
        delivery = queue.popleft()
        if delivery.message.is_expired():
            conn.stats.drop("expired")
        elif conn.acl_cache is not None and not may_read(conn, delivery):
            continue
        elif delivery.qos == 0:
            send_publish(conn, delivery, None, False)
        else:
            _send_inflight(conn, session, delivery)


def resend_inflight(conn: "Connection") -> None:
    """On session resume: unacknowledged PUBLISH again with DUP, released QoS 2 as PUBREL,
    within the client's Receive Maximum now (MQTT 5.0 section 4.9; it may be smaller than
    when they were sent). The others go back to the front of the queue, keeping their
    packet IDs, and leave as the window opens: a client closed for not reading
    (`force_shutdown.max_heap_size`) is not sent its whole backlog at once again."""
    session = conn.session
    assert session is not None
    inflight = session.inflight
    room = conn.send_window
    later: list[int] = []
    for packet_id, delivery in list(inflight.items()):
        if packet_id in session.awaiting_comp:
            conn.send_packet(Pubrel(packet_id))
        elif room > 0:
            send_publish(conn, delivery, packet_id, True)
        else:
            later.append(packet_id)
            continue
        room -= 1
    for packet_id in reversed(later):
        delivery = inflight.pop(packet_id)
        delivery.packet_id = packet_id
        delivery.sent = True
        session.queue.appendleft(delivery)


def send_publish(conn: "Connection", delivery: Delivery, packet_id: int | None,
                 dup: bool) -> None:
    message = delivery.message
    topic = message.topic
    version = conn.version
    alias = None
    if not dup and (version != MQTT_5 or not (
        message.properties or message.expires_at is not None
        or delivery.subscription_ids or conn.client_alias_max
    )):
        data = shared_publish(message, version, delivery.qos, delivery.retain, packet_id)
    elif version == MQTT_5:
        props = (
            message.outgoing_properties()
            if message.properties or message.expires_at is not None else {}
        )
        if delivery.subscription_ids:
            props[_SUB_IDS] = list(delivery.subscription_ids)
        aliases = conn.out_aliases if conn.client_alias_max else None
        alias = aliases.get(topic) if aliases is not None else None
        if alias is not None:
            props[_TOPIC_ALIAS] = alias
            topic = ""
        elif aliases is not None and len(aliases) < conn.client_alias_max:
            alias = props[_TOPIC_ALIAS] = len(aliases) + 1
        data = encode_publish(topic, message.payload, delivery.qos, delivery.retain, dup,
                              packet_id, props or None, MQTT_5)
    else:
        data = encode_publish(topic, message.payload, delivery.qos, delivery.retain, dup,
                              packet_id, None, version)
    if conn.client_max_packet is not None and len(data) > conn.client_max_packet:
        # MQTT-3.1.2-25: a packet larger than the client allows is discarded, not sent.
        conn.stats.drop("too_large_for_client")
        if packet_id is not None and conn.session is not None:
            conn.session.finish(packet_id)
        return
    if alias is not None and topic:
        conn.out_aliases[topic] = alias
    conn.stats.messages_sent[delivery.qos] += 1
    conn.send(data)
