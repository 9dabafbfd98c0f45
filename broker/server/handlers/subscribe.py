"""SUBSCRIBE: validate each filter, store options, SUBACK, then retained messages.

A SUBSCRIBE may carry tens of thousands of filters. Its filters are applied in time slices
(`TimeSlice`) so that one packet never stalls the other connections; while they are, the
client's later packets wait (`Connection.hold_input`), so its packets keep their order.
"""

import asyncio
from typing import TYPE_CHECKING

from broker.ds import now_us
from broker.mqtt.constants import PropertyId, ReasonCode
from broker.mqtt.errors import MQTTError, ProtocolError
from broker.mqtt.packets import Suback, Subscribe, Subscription
from broker.mqtt.topic import parse_shared, validate_topic_filter
from broker.session.durable.session import DurableSession
from broker.session.durable.turn import TimeSlice
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


class _Subscribing:
    """One SUBSCRIBE being applied, filter by filter, then answered: SUBACK, then the
    retained messages its filters matched."""

    __slots__ = ("applied", "codes", "conn", "identifier", "max_qos", "packet", "retained",
                 "sent", "session")

    def __init__(self, conn: "Connection", session: Session, packet: Subscribe) -> None:
        self.conn = conn
        self.session = session
        self.packet = packet
        identifiers = packet.properties.get(PropertyId.SUBSCRIPTION_IDENTIFIER)
        self.identifier: int | None = identifiers[0] if identifiers else None
        self.max_qos: int = conn.node.config["mqtt.max_qos_allowed"]
        self.codes: list[int] = []
        self.retained: list[Delivery] = []
        self.applied = 0  # filters
        self.sent = -1  # retained messages delivered; -1 until the SUBACK is sent

    def run(self, budget: TimeSlice) -> bool:
        """Goes on until the budget is spent; True once everything is done."""
        subscriptions, retained, conn = self.packet.subscriptions, self.retained, self.conn
        while self.applied < len(subscriptions):
            if budget.spent():
                return False
            self._apply(subscriptions[self.applied])
            self.applied += 1
        if self.sent < 0:
            conn.send_packet(Suback(self.packet.packet_id, self.codes))
            self.sent = 0
        while self.sent < len(retained):
            if budget.spent():
                return False
            conn.deliver(retained[self.sent])
            self.sent += 1
        return True

    def _apply(self, sub: Subscription) -> None:
        conn, session, node = self.conn, self.session, self.conn.node
        try:
            group, topic_filter = _check(conn, sub)
        except MQTTError as error:
            self.codes.append(error.reason_code)
            return
        if group is not None and sub.no_local:
            # MQTT-3.8.3-4: No Local on a shared subscription is a Protocol Error.
            raise ProtocolError("No Local set on a shared subscription")
        granted = min(sub.qos, self.max_qos)
        identifier = self.identifier
        options = SubscriptionOptions(
            granted, sub.no_local, sub.retain_as_published, sub.retain_handling, identifier,
            group,
        )
        existed = sub.topic_filter in session.subscriptions
        if isinstance(session, DurableSession) and group is None and node.durable is not None:
            # Read from Durable Storage, not routed: the topics become durable from now on.
            node.add_durable_filter(session.client_id, topic_filter, options)
            node.durable.store.write_soon([session.subscribe(topic_filter, options, now_us())])
        else:
            session.subscriptions[sub.topic_filter] = options
            node.router.subscribe(session.client_id, topic_filter, options)
        self.codes.append(granted)
        send_retained = sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed)
        if group is None and send_retained and node.retainer is not None:
            sub_ids = (identifier,) if identifier is not None else ()
            self.retained.extend(
                Delivery(message, min(message.qos, granted), True, sub_ids)
                for message in node.retainer.match(topic_filter)
            )

    async def run_rest(self, budget: TimeSlice) -> None:
        """What one slice did not reach, a slice per event-loop turn; stops if the
        connection closes meanwhile (what was applied stays, as if the client had left
        right after its SUBSCRIBE)."""
        while True:
            await budget.next()
            if self.conn.closed or self.run(budget):
                return


def handle_subscribe(conn: "Connection", packet: Subscribe) -> None:
    session = conn.session
    assert session is not None
    subscribing = _Subscribing(conn, session, packet)
    budget = TimeSlice()
    if not subscribing.run(budget):
        conn.hold_input(asyncio.get_running_loop().create_task(subscribing.run_rest(budget)))
