"""SUBSCRIBE: validate each filter, store options, SUBACK, then retained messages.

Applied in time slices (`handle_in_slices`): a SUBSCRIBE may carry tens of thousands of
filters and must not stall the other connections while they are applied. With the HTTP
authorization service, the filters it must be asked about are asked first, a few at a time,
in a task that holds the client's later packets (`authorize`).
"""

import asyncio
from collections.abc import Awaitable, Iterator
from typing import TYPE_CHECKING, Final

from broker.auth.authorization import REFUSAL_CODES, Verdict
from broker.mqtt.codec import encode
from broker.mqtt.constants import PropertyId, ReasonCode
from broker.mqtt.errors import MQTTError, ProtocolError
from broker.mqtt.packets import Suback, Subscribe, Subscription
from broker.mqtt.topic import STREAM_PREFIX, parse_shared, validate_topic_filter
from broker.server.handlers.authorize import verdict_later, verdict_now
from broker.server.handlers.sliced import finish_in_slices, handle_in_slices
from broker.server.handlers.stream_subscribe import start_stream, stream_target, suback_properties
from broker.session.durable.turn import TimeSlice
from broker.session.session import Delivery, Session, SubscriptionOptions

if TYPE_CHECKING:
    from broker.server.connection import Connection

_ASKED_AT_ONCE: Final = 8  # a SUBSCRIBE's requests out at once to the HTTP service


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


def _target(conn: "Connection", session: Session,
            sub: Subscription) -> tuple[str | None, str, bool]:
    """(share group, the filter authorized and read, whether it is a `$stream` replay), or
    MQTTError: a `$stream/<name>` subscription is authorized on its stream's filter, so a
    stream cannot read what the ACL denies directly."""
    group, topic_filter = _check(conn, sub)
    if group is None and topic_filter.startswith(STREAM_PREFIX):
        return None, stream_target(conn, session, topic_filter), True
    return group, topic_filter, False


def handle_subscribe(conn: "Connection", packet: Subscribe) -> None:
    session = conn.session
    assert session is not None
    groups_soon = _groups_soon(conn, session, packet)
    ask = conn.acl_cache is not None and conn.node.security.http_authz is not None
    if groups_soon is not None or ask:
        conn.hold_input(asyncio.get_running_loop().create_task(
            _subscribe_later(conn, session, packet, groups_soon, ask)))
        return
    handle_in_slices(conn, _subscribe(conn, session, packet, None))


def _groups_soon(conn: "Connection", session: Session,
                 packet: Subscribe) -> Awaitable[bool] | None:
    """A wait for the cluster to allow durable groups when a durable session subscribes to
    `$share/...` just before it does (a fresh builtin_raft cluster's first moments): joined
    then, its group reads every message from its start. Subscribed before, it would be routed
    live, not stored with the session, and moved into its group at the rise, a switch in
    which messages in flight between nodes come twice."""
    groups = conn.node.groups
    if groups is None or not any(sub.topic_filter.startswith("$share/")
                                 for sub in packet.subscriptions):
        return None
    return groups.joining_soon(session)


async def _subscribe_later(conn: "Connection", session: Session, packet: Subscribe,
                           groups_soon: Awaitable[bool] | None, ask: bool) -> None:
    """The SUBSCRIBE applied once the cluster allows durable groups (or the wait ended:
    routed live then) and the HTTP service's verdicts are in (`ask`)."""
    if groups_soon is not None:
        await groups_soon
    if not ask:
        await finish_in_slices(conn, _subscribe(conn, session, packet, None))
        return
    await _subscribe_when_decided(conn, session, packet)


async def _subscribe_when_decided(conn: "Connection", session: Session,
                                  packet: Subscribe) -> None:
    """Each valid filter's verdict, asking the service where the cache has none, then the
    SUBSCRIBE applied with them."""
    verdicts: dict[str, Verdict] = {}
    ask: list[tuple[str, int]] = []
    budget = TimeSlice()  # tens of thousands of filters must not stall other clients
    for sub in packet.subscriptions:
        if budget.spent():
            await budget.next()
        try:
            _, topic_filter, _ = _target(conn, session, sub)
        except MQTTError:
            continue  # refused by _subscribe, without asking
        verdict = verdict_now(conn, "subscribe", topic_filter, sub.qos, False)
        if verdict is None:
            ask.append((topic_filter, sub.qos))
        else:
            verdicts[topic_filter] = verdict
    for start in range(0, len(ask), _ASKED_AT_ONCE):
        batch = ask[start:start + _ASKED_AT_ONCE]
        answers = await asyncio.gather(*(verdict_later(conn, "subscribe", topic_filter, qos,
                                                       False) for topic_filter, qos in batch))
        if conn.closed:
            return
        verdicts.update(zip((topic_filter for topic_filter, _ in batch), answers, strict=True))
    await finish_in_slices(conn, _subscribe(conn, session, packet, verdicts))


def _subscribe(conn: "Connection", session: Session, packet: Subscribe,
               verdicts: dict[str, Verdict] | None) -> Iterator[None]:
    """`verdicts`: each valid filter's, decided beforehand; None: asked here (no service)."""
    node = conn.node
    identifiers = packet.properties.get(PropertyId.SUBSCRIPTION_IDENTIFIER)
    identifier = identifiers[0] if identifiers else None
    max_qos = node.config["mqtt.max_qos_allowed"]
    max_subscriptions = node.config["mqtt.max_subscriptions"]
    codes: list[int] = []
    reasons: list[str] = []  # why `$stream` filters were refused (the SUBACK's Reason String)
    retained: list[Delivery] = []
    durable = False  # a subscription stored with the session: its SUBACK waits for the disk
    for sub in packet.subscriptions:
        yield
        try:
            group, topic_filter, stream = _target(conn, session, sub)
        except MQTTError as error:
            codes.append(error.reason_code)
            if sub.topic_filter.startswith(STREAM_PREFIX):
                reasons.append(f"{sub.topic_filter[:64]}: {error}")
            continue
        verdict = verdicts[topic_filter] if verdicts is not None else verdict_now(
            conn, "subscribe", topic_filter, sub.qos, False)
        assert verdict is not None  # immediate without the service
        if verdict is not Verdict.ALLOW:
            if verdict is Verdict.DENY and conn.node.security.disconnect_on_deny:
                # the connection ends (v5: 0x87)
                raise MQTTError(f"not authorized to subscribe to {topic_filter!r}",
                                ReasonCode.NOT_AUTHORIZED)
            # 0x87 denied; 0x97 or 0x80 the HTTP service could not be asked or failed
            # (counted in mqtt_authz_unavailable_total); 3.1.1: 0x80 for all.
            codes.append(REFUSAL_CODES[verdict])
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
            node.add_durable_filter(session.client_id, sub.topic_filter)
            durable = True
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
    suback = Suback(packet.packet_id, codes, suback_properties(conn, codes, reasons))
    conn.send_when(session.stored() if durable else None, encode(suback, conn.version))
    for delivery in retained:
        yield
        conn.deliver(delivery)
