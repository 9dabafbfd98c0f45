"""SUBSCRIBE: validate each filter, store options, SUBACK, then retained messages.

Applied in time slices (`handle_in_slices`): a SUBSCRIBE may carry tens of thousands of
filters and must not stall the other connections while they are applied.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from broker.auth.acl import Access
from broker.mqtt.constants import PropertyId, ReasonCode
from broker.mqtt.errors import MQTTError, ProtocolError
from broker.mqtt.packets import Suback, Subscribe, Subscription
from broker.mqtt.topic import STREAM_PREFIX, parse_shared, validate_topic_filter
from broker.server.handlers.sliced import handle_in_slices
from broker.server.handlers.stream_subscribe import start_stream, stream_target, suback_properties
from broker.session.session import Delivery, Session, SubscriptionOptions

if TYPE_CHECKING:
    from broker.server.connection import Connection


def _check(conn: "Connection", sub: Subscription) -> tuple[str | None, str]:
    """(share group, filter), or MQTTError carrying this filter's SUBACK reason code."""
    config = conn.node.config
    group, topic_filter = parse_shared(sub.topic_filter)
    validate_topic_filter(topic_filter)
    if topic_filter.count("/") >= config["mqtt.max_topic_levels"]:
        raise MQTTError("too many levels", ReasonCode.TOPIC_FILTER_INVALID)
    if not config["mqtt.wildcard_subscription"] and ("+" in topic_filter or "#" in topic_filter):
        raise MQTTError("wildcards disabled", ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED)
    if group is not None and not config["mqtt.shared_subscription"]:
        raise MQTTError("shared disabled", ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED)
    return group, topic_filter


def handle_subscribe(conn: "Connection", packet: Subscribe) -> None:
    session = conn.session
    assert session is not None
    handle_in_slices(conn, _subscribe(conn, session, packet))


def _subscribe(conn: "Connection", session: Session, packet: Subscribe) -> Iterator[None]:
    node = conn.node
    identifiers = packet.properties.get(PropertyId.SUBSCRIPTION_IDENTIFIER)
    identifier = identifiers[0] if identifiers else None
    max_qos = node.config["mqtt.max_qos_allowed"]
    max_subscriptions = node.config["mqtt.max_subscriptions"]
    codes: list[int] = []
    reasons: list[str] = []  # why `$stream` filters were refused (the SUBACK's Reason String)
    retained: list[Delivery] = []
    for sub in packet.subscriptions:
        yield
        stream = False
        try:
            group, topic_filter = _check(conn, sub)
            if group is None and topic_filter.startswith(STREAM_PREFIX):
                stream, topic_filter = True, stream_target(conn, session, topic_filter)
        except MQTTError as error:
            codes.append(error.reason_code)
            if sub.topic_filter.startswith(STREAM_PREFIX):
                reasons.append(f"{sub.topic_filter[:64]}: {error}")
            continue
        if not conn.authorized(topic_filter, Access.READ):
            if conn.node.security.disconnect_on_deny:  # the connection ends (v5: 0x87)
                raise MQTTError(f"not authorized to subscribe to {topic_filter!r}",
                                ReasonCode.NOT_AUTHORIZED)
            codes.append(ReasonCode.NOT_AUTHORIZED)
            continue
        if group is not None and sub.no_local:
            # MQTT-3.8.3-4: No Local on a shared subscription is a Protocol Error.
            raise ProtocolError("No Local set on a shared subscription")
        granted = min(sub.qos, max_qos)
        options = SubscriptionOptions(
            granted, sub.no_local, sub.retain_as_published, sub.retain_handling, identifier,
            group,
        )
        existed = sub.topic_filter in session.subscriptions
        if not existed and 0 < max_subscriptions <= len(session.subscriptions):
            node.stats.refuse("max_subscriptions")
            codes.append(ReasonCode.QUOTA_EXCEEDED)
            continue
        if stream:
            try:
                start_stream(conn, session, sub.topic_filter, packet.properties)
            except MQTTError as error:
                codes.append(error.reason_code)
                reasons.append(f"{sub.topic_filter[:64]}: {error}")
                continue
        if session.subscribe(sub.topic_filter, options):
            # Read from Durable Storage, not routed: the topics become durable from now on.
            node.add_durable_filter(session.client_id, sub.topic_filter, options)
        else:
            node.router.subscribe(session.client_id, topic_filter, options)
        codes.append(granted)
        send_retained = sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed)
        if group is None and send_retained and node.retainer is not None and not stream:
            sub_ids = (identifier,) if identifier is not None else ()
            retained.extend(
                Delivery(message, min(message.qos, granted), True, sub_ids)
                for message in node.retainer.match(topic_filter)
            )
    conn.send_packet(Suback(packet.packet_id, codes, suback_properties(conn, codes, reasons)))
    for delivery in retained:
        yield
        conn.deliver(delivery)
