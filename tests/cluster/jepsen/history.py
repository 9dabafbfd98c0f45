"""What the clients of a fault test saw, and the checker that judges it. Pure: no I/O.

A history is a list of events in one global order (the order in which the workload's
threads recorded them under one lock). The position of an event in that list is its
*index*; "before" below always means "at a smaller index".

Publisher events:
    Attempt(publisher, seq, qos, node, conn)   a PUBLISH is about to be sent on connection
                                              `conn` (the publisher's n-th connection; each
                                              is a new session, Clean Start 1)
    Ack(publisher, seq, conn)                  its PUBACK (QoS 1) / PUBCOMP (QoS 2) arrived
    Fail(publisher, seq, conn, reason)         the connection ended before the
                                              acknowledgement, or the broker refused it
                                              (reason code >= 0x80): outcome unknown

A message is identified by (publisher, seq). A publisher may send one message again on a
later connection (Attempt with a new `conn`): that is a new PUBLISH for the broker, so
MQTT's exactly-once promise for QoS 2 does not cover the two copies.

Subscriber events:
    Connected(subscriber, node, session_present)   a CONNACK with reason code 0
    Subscribed(subscriber, node)                   the SUBACK of the workload's filter
    Delivered(subscriber, publisher, seq, qos, dup, node)
                                                   a PUBLISH handed to the application
                                                   (publisher "" and seq -1: a payload
                                                   that could not be read)
Nemesis events (Nemesis(op, detail)) only label the history (fault injected, healed).

The rules, for each subscriber S whose first SUBACK came before a message's first Attempt
(the message is *expected* at S; S subscribes once, with Clean Start 0 and a long Session
Expiry, so its session must hold the subscription from then on):

lost          an acknowledged expected message S never received. Must be 0.
reordered     order per publisher and QoS (MQTT-4.6.0-6 orders PUBLISHes "for the same Topic
              and QoS"; each publisher has one topic, and paho hands a QoS 2 message to the
              application on PUBREL, after QoS 1 ones sent later). Message a *precedes*
              message b (same publisher, same QoS) when the broker provably had a before b:
              a was acknowledged before b's first Attempt, or a was acknowledged on a
              connection on which b was attempted after a (TCP keeps order on one
              connection). Only *first* deliveries count (the first copy of each message S
              received; later copies are redeliveries, which MQTT allows after a reconnect,
              and they carry DUP). A first delivery of a that comes after the first delivery
              of some b that a precedes is one reordered message. Must be 0.
qos2_duplicates  extra copies (beyond the first) of a QoS 2 message at S, when the
              publisher sent it on one connection only. Must be 0.
resend_duplicates  extra copies of a QoS 2 message the publisher sent again on a new
              connection (a new session: allowed, reported).
qos1_duplicates  extra copies of QoS 1 messages (allowed, reported).
missing_dup   a second or later copy of a message the publisher sent on one connection only,
              without the DUP flag, at a subscriber whose session was never lost: the broker
              sent one PUBLISH twice and did not mark the redelivery (MQTT-3.3.1-1). Must be 0.
unexpected    a delivery of something never attempted, an unreadable payload, or a QoS other
              than the published one (the subscription grants QoS 2). Must be 0.
sessions_lost a CONNACK with Session Present 0 for S after its SUBACK. Must be 0.
recovered     messages never acknowledged (Fail) that some subscriber received anyway
              (allowed: the broker had them when the connection dropped).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import ClassVar, Final

EXAMPLES: Final = 5  # examples kept per rule


# ---- events -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Attempt:
    publisher: str
    seq: int
    qos: int
    node: str
    conn: int


@dataclass(frozen=True, slots=True)
class Ack:
    publisher: str
    seq: int
    conn: int


@dataclass(frozen=True, slots=True)
class Fail:
    publisher: str
    seq: int
    conn: int
    reason: str = "connection lost"


@dataclass(frozen=True, slots=True)
class Connected:
    subscriber: str
    node: str
    session_present: bool


@dataclass(frozen=True, slots=True)
class Subscribed:
    subscriber: str
    node: str


@dataclass(frozen=True, slots=True)
class Delivered:
    subscriber: str
    publisher: str
    seq: int
    qos: int
    dup: bool
    node: str


@dataclass(frozen=True, slots=True)
class Nemesis:
    op: str
    detail: str = ""


Event = Attempt | Ack | Fail | Connected | Subscribed | Delivered | Nemesis
Key = tuple[str, int]  # (publisher, seq)


def payload(publisher: str, seq: int) -> bytes:
    """The payload a workload message carries: enough to name it."""
    return f"{publisher}:{seq}".encode()


def parse_payload(data: bytes) -> Key | None:
    """(publisher, seq) from a payload, None if it is not one of ours."""
    try:
        publisher, _, seq = data.decode().rpartition(":")
        return (publisher, int(seq)) if publisher else None
    except (UnicodeDecodeError, ValueError):
        return None


# ---- the report -------------------------------------------------------------------------------
@dataclass
class Report:
    attempted: int = 0  # distinct messages
    acknowledged: int = 0
    unknown: int = 0  # attempted, never acknowledged
    resent: int = 0  # sent again on a later connection (the first one ended unacknowledged)
    delivered: int = 0  # every copy handed to a subscriber
    subscribers: int = 0
    lost: int = 0
    reordered: int = 0
    qos2_duplicates: int = 0
    missing_dup: int = 0
    unexpected: int = 0
    sessions_lost: int = 0
    qos1_duplicates: int = 0
    resend_duplicates: int = 0
    recovered: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)
    # (subscriber, publisher, seq, index of its first Attempt, index of its Ack) of each lost
    # message: a long run attributes them to the faults around them.
    lost_messages: list[tuple[str, str, int, int, int]] = field(default_factory=list)

    VIOLATIONS: ClassVar[tuple[str, ...]] = (
        "lost", "reordered", "qos2_duplicates", "missing_dup", "unexpected", "sessions_lost")

    @property
    def ok(self) -> bool:
        return all(getattr(self, name) == 0 for name in self.VIOLATIONS)

    def violations(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.VIOLATIONS if getattr(self, name)}

    def example(self, rule: str, text: str) -> None:
        kept = self.examples.setdefault(rule, [])
        if len(kept) < EXAMPLES:
            kept.append(text)

    def summary(self) -> str:
        lines = [
            f"messages: {self.attempted} attempted, {self.acknowledged} acknowledged,"
            f" {self.unknown} unknown, {self.resent} resent; {self.delivered} deliveries to"
            f" {self.subscribers} subscribers",
            "violations: " + (", ".join(f"{k}={v}" for k, v in self.violations().items())
                              or "none"),
            f"allowed: qos1_duplicates={self.qos1_duplicates}"
            f" resend_duplicates={self.resend_duplicates} recovered={self.recovered}",
        ]
        for rule, texts in self.examples.items():
            lines += [f"  {rule}: {text}" for text in texts]
        return "\n".join(lines)


# ---- the checker ------------------------------------------------------------------------------
@dataclass(slots=True)
class _Message:
    qos: int
    first_attempt: int  # index
    attempts: dict[int, int] = field(default_factory=dict)  # conn -> index of its Attempt
    ack: int | None = None  # index of the first Ack
    ack_conn: int | None = None
    failed: bool = False


def check(events: list[Event]) -> Report:
    report = Report()
    messages: dict[Key, _Message] = {}
    subscribed: dict[str, int] = {}
    connects: dict[str, list[tuple[int, Connected]]] = defaultdict(list)
    deliveries: dict[str, list[Delivered]] = defaultdict(list)
    for index, event in enumerate(events):
        if isinstance(event, Attempt):
            key = (event.publisher, event.seq)
            message = messages.get(key)
            if message is None:
                message = messages[key] = _Message(event.qos, index)
            message.attempts.setdefault(event.conn, index)
        elif isinstance(event, Ack):
            message = messages.get((event.publisher, event.seq))
            if message is not None and message.ack is None:
                message.ack, message.ack_conn = index, event.conn
        elif isinstance(event, Fail):
            message = messages.get((event.publisher, event.seq))
            if message is not None:
                message.failed = True
        elif isinstance(event, Subscribed):
            subscribed.setdefault(event.subscriber, index)
        elif isinstance(event, Connected):
            connects[event.subscriber].append((index, event))
        elif isinstance(event, Delivered):
            deliveries[event.subscriber].append(event)

    report.attempted = len(messages)
    report.acknowledged = sum(1 for m in messages.values() if m.ack is not None)
    report.unknown = report.attempted - report.acknowledged
    report.resent = sum(1 for m in messages.values() if len(m.attempts) > 1)
    report.delivered = sum(len(d) for d in deliveries.values())
    report.subscribers = len(subscribed)

    received_by_anyone: set[Key] = set()
    for subscriber, delivered in deliveries.items():
        copies: Counter[Key] = Counter()
        for delivery in delivered:
            key = (delivery.publisher, delivery.seq)
            message = messages.get(key)
            if message is None:
                report.unexpected += 1
                report.example("unexpected", f"{subscriber} got {key[0]}:{key[1]}, never"
                               f" published (at {delivery.node})")
                continue
            if delivery.qos != message.qos:
                report.unexpected += 1
                report.example("unexpected", f"{subscriber} got {key[0]}:{key[1]} with QoS"
                               f" {delivery.qos}, published with QoS {message.qos}")
            copies[key] += 1
            received_by_anyone.add(key)

    for subscriber, joined in subscribed.items():
        lost_session = False
        for index, connected in connects.get(subscriber, []):
            if index > joined and not connected.session_present:
                lost_session = True
                report.sessions_lost += 1
                report.example("sessions_lost", f"{subscriber} reconnected at"
                               f" {connected.node} with Session Present 0 (event {index})")
        delivered = deliveries.get(subscriber, [])
        _duplicates(report, subscriber, delivered, messages, lost_session)
        got = {(d.publisher, d.seq) for d in delivered}
        for key, message in messages.items():
            if message.ack is not None and message.first_attempt > joined and key not in got:
                report.lost += 1
                report.lost_messages.append((subscriber, key[0], key[1],
                                             message.first_attempt, message.ack))
                report.example("lost", f"{subscriber} never got {key[0]}:{key[1]} (QoS"
                               f" {message.qos}, acknowledged, event {message.ack})")
        _order(report, subscriber, delivered, messages, joined)

    report.recovered = sum(1 for key, m in messages.items()
                           if m.ack is None and m.failed and key in received_by_anyone)
    return report


def _duplicates(report: Report, subscriber: str, delivered: list[Delivered],
                messages: dict[Key, _Message], lost_session: bool) -> None:
    seen: set[Key] = set()
    for delivery in delivered:
        key = (delivery.publisher, delivery.seq)
        message = messages.get(key)
        if message is None:
            continue
        if key not in seen:
            seen.add(key)
            continue
        resent = len(message.attempts) > 1
        if message.qos == 1:
            report.qos1_duplicates += 1
        elif resent:
            report.resend_duplicates += 1
        else:
            report.qos2_duplicates += 1
            report.example("qos2_duplicates", f"{subscriber} got QoS 2 {key[0]}:{key[1]}"
                           f" again (dup={delivery.dup}, at {delivery.node})")
        if not resent and not delivery.dup and not lost_session:
            report.missing_dup += 1
            report.example("missing_dup", f"{subscriber} got {key[0]}:{key[1]} again"
                           f" without DUP (QoS {message.qos}, at {delivery.node})")


def _order(report: Report, subscriber: str, delivered: list[Delivered],
           messages: dict[Key, _Message], joined: int) -> None:
    """One pass per publisher and QoS over the first deliveries: a message is late if an
    earlier first delivery (same publisher, same QoS) was first attempted after this one's
    acknowledgement, or was attempted after it on the connection that acknowledged it."""
    by_publisher: dict[tuple[str, int], list[tuple[int, _Message]]] = defaultdict(list)
    seen: set[Key] = set()
    for delivery in delivered:
        key = (delivery.publisher, delivery.seq)
        message = messages.get(key)
        if message is None or key in seen or message.first_attempt <= joined:
            continue
        seen.add(key)
        by_publisher[delivery.publisher, message.qos].append((delivery.seq, message))
    for (publisher, _qos), firsts in by_publisher.items():
        latest_start = -1  # the largest first-Attempt index among earlier first deliveries
        latest_start_seq = 0
        latest_on: dict[int, tuple[int, int]] = {}  # conn -> (largest Attempt index, seq)
        for seq, message in firsts:
            if message.ack is not None and message.ack_conn is not None:
                overtaken = None
                on_conn = latest_on.get(message.ack_conn)
                if latest_start > message.ack:
                    overtaken = latest_start_seq
                elif on_conn is not None and on_conn[0] > message.attempts[message.ack_conn]:
                    overtaken = on_conn[1]
                if overtaken is not None:
                    report.reordered += 1
                    report.example("reordered", f"{subscriber} got {publisher}:{seq} after"
                                   f" {publisher}:{overtaken}, though the broker had it first")
            if message.first_attempt > latest_start:
                latest_start, latest_start_seq = message.first_attempt, seq
            for conn, index in message.attempts.items():
                if index > latest_on.get(conn, (-1, 0))[0]:
                    latest_on[conn] = (index, seq)
