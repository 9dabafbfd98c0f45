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

A shared history (`check_shared`) is that of the members of one durable shared subscription
(`$share/<group>/<filter>`, each member a durable session): each message goes to one member.
One more event:
    Ended(subscriber, node, dropped)       the workload ends the member's session: recorded
                                           before the CONNECT with Clean Start 1 is sent,
                                           with the QoS 2 messages the member had received
                                           and not been released (PUBREC sent, no PUBREL)
A *member* is one session of a subscriber: its deliveries up to its first Ended, then those
up to its next, and so on. The rules, a message being expected when its first Attempt came
after the first SUBACK of any member (the group holds the subscription from then on):

lost          an acknowledged expected message no member received, unless it is a QoS 2
              message an ended member may have held (MQTT-4.8.2-5: the broker drops it): one
              in an Ended's `dropped` (`dropped`), or one it may have held unsent
              (`dropped_unseen`). Must be 0.
doubled       a QoS 1 message received by a second member while an earlier member that
              received it still had its session. Must be 0.
redelivered   a QoS 1 message received by a member after every earlier member that received it
              ended its session (MQTT-4.8.2-5: the broker sends it to another member; allowed,
              reported; whether the earlier one had acknowledged it is not told: a PUBACK sent
              just before a reset may never have been read).
wrong_dup     such a redelivery with DUP 1 though its member did not reconnect since the end:
              for that member it is a first delivery (its owner sends it as a new one). Must
              be 0.
qos2_doubled  a QoS 2 message received by a second member, or after it was dropped by an
              ended member. Must be 0.
resend_doubled  a message the publisher sent on two connections (two PUBLISHes for the broker)
              received by two members (allowed, reported).
dropped       QoS 2 messages dropped with an ended member that had received them (allowed,
              reported).
dropped_unseen  QoS 2 messages no member received that an ended member may have held without
              sending them (a member takes up to two windows, the client sees one): acknowledged
              before an Ended event E, while no message of the same publisher stored after it
              (first attempted after its acknowledgement) reached a member before E (a shard
              is read in order: what the member held unsent is the last its readers took).
              Allowed, reported.
Within one member the duplicate rules above hold (qos2_duplicates, missing_dup, ...);
sessions_lost excuses the CONNACKs (Session Present 0) between an Ended and the next
SUBACK; `reordered` is not checked (a shard's move to another member breaks per-publisher
order).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable
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


Key = tuple[str, int]  # (publisher, seq)


@dataclass(frozen=True, slots=True)
class Ended:
    subscriber: str
    node: str
    dropped: tuple[Key, ...] = ()  # QoS 2 messages received, not released


Event = Attempt | Ack | Fail | Connected | Subscribed | Delivered | Nemesis | Ended


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
    ALLOWED: ClassVar[tuple[str, ...]] = ("qos1_duplicates", "resend_duplicates", "recovered")

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
            "allowed: " + " ".join(f"{name}={getattr(self, name)}" for name in self.ALLOWED),
        ]
        for rule, texts in self.examples.items():
            lines += [f"  {rule}: {text}" for text in texts]
        return "\n".join(lines)


@dataclass
class SharedReport(Report):
    """`check_shared`'s: the figures of a shared subscription's members (`subscribers`)."""

    ended: int = 0  # members' sessions the workload ended
    doubled: int = 0
    qos2_doubled: int = 0
    wrong_dup: int = 0
    redelivered: int = 0
    resend_doubled: int = 0
    dropped: int = 0
    dropped_unseen: int = 0

    VIOLATIONS: ClassVar[tuple[str, ...]] = (
        "lost", "doubled", "qos2_doubled", "wrong_dup", "qos2_duplicates", "missing_dup",
        "unexpected", "sessions_lost")
    ALLOWED: ClassVar[tuple[str, ...]] = (
        "ended", "redelivered", "dropped", "dropped_unseen", "resend_doubled",
        *Report.ALLOWED)


# ---- the checker ------------------------------------------------------------------------------
@dataclass(slots=True)
class _Message:
    qos: int
    first_attempt: int  # index
    attempts: dict[int, int] = field(default_factory=dict)  # conn -> index of its Attempt
    ack: int | None = None  # index of the first Ack
    ack_conn: int | None = None
    failed: bool = False


@dataclass(slots=True)
class _History:
    """A history sorted out: messages, and per subscriber its events with their indices."""

    messages: dict[Key, _Message] = field(default_factory=dict)
    subscribed: dict[str, int] = field(default_factory=dict)  # index of the first SUBACK
    subacks: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    connects: dict[str, list[tuple[int, Connected]]] = field(
        default_factory=lambda: defaultdict(list))
    deliveries: dict[str, list[tuple[int, Delivered]]] = field(
        default_factory=lambda: defaultdict(list))
    ends: dict[str, list[tuple[int, Ended]]] = field(default_factory=lambda: defaultdict(list))
    received: set[Key] = field(default_factory=set)  # delivered to anyone


def _read(events: list[Event], report: Report) -> _History:
    """The history sorted out, and the report's counts and `unexpected` deliveries."""
    history = _History()
    messages = history.messages
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
            history.subscribed.setdefault(event.subscriber, index)
            history.subacks[event.subscriber].append(index)
        elif isinstance(event, Connected):
            history.connects[event.subscriber].append((index, event))
        elif isinstance(event, Delivered):
            history.deliveries[event.subscriber].append((index, event))
        elif isinstance(event, Ended):
            history.ends[event.subscriber].append((index, event))

    report.attempted = len(messages)
    report.acknowledged = sum(1 for m in messages.values() if m.ack is not None)
    report.unknown = report.attempted - report.acknowledged
    report.resent = sum(1 for m in messages.values() if len(m.attempts) > 1)
    report.delivered = sum(len(d) for d in history.deliveries.values())
    report.subscribers = len(history.subscribed)
    for subscriber, delivered in history.deliveries.items():
        for _index, delivery in delivered:
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
            history.received.add(key)
    report.recovered = sum(1 for key, m in messages.items()
                           if m.ack is None and m.failed and key in history.received)
    return history


def _sessions_lost(report: Report, subscriber: str, history: _History, joined: int) -> bool:
    """Counts the CONNACKs with Session Present 0 `subscriber` got while its session held a
    subscription: a SUBACK came after its last Ended event (Clean Start 1: a new session)
    before the CONNACK. A session begun again holds nothing until its SUBACK, and a crash
    before then (its CONNACK goes out before the empty session is on disk) loses nothing:
    the client learns it from Session Present 0 and subscribes again."""
    marks = sorted([(index, False) for index, _ in history.ends.get(subscriber, [])]
                   + [(index, True) for index in history.subacks.get(subscriber, [])])
    lost_session = False
    passed, holds = 0, False
    for index, connected in history.connects.get(subscriber, []):
        while passed < len(marks) and marks[passed][0] < index:
            holds = marks[passed][1]
            passed += 1
        if index > joined and holds and not connected.session_present:
            lost_session = True
            holds = False  # (until its next SUBACK)
            report.sessions_lost += 1
            report.example("sessions_lost", f"{subscriber} reconnected at"
                           f" {connected.node} with Session Present 0 (event {index})")
    return lost_session


def _lost(report: Report, who: str, key: Key, message: _Message) -> None:
    assert message.ack is not None
    report.lost += 1
    report.lost_messages.append((who, key[0], key[1], message.first_attempt, message.ack))
    report.example("lost", f"{who} never got {key[0]}:{key[1]} (QoS {message.qos},"
                   f" acknowledged, event {message.ack})")


def check(events: list[Event]) -> Report:
    report = Report()
    history = _read(events, report)
    messages = history.messages
    for subscriber, joined in history.subscribed.items():
        lost_session = _sessions_lost(report, subscriber, history, joined)
        delivered = [d for _, d in history.deliveries.get(subscriber, [])]
        _duplicates(report, subscriber, delivered, messages, lost_session)
        got = {(d.publisher, d.seq) for d in delivered}
        for key, message in messages.items():
            if message.ack is not None and message.first_attempt > joined and key not in got:
                _lost(report, subscriber, key, message)
        _order(report, subscriber, delivered, messages, joined)
    return report


def check_shared(events: list[Event]) -> SharedReport:
    """The rules of a shared subscription's history (module docstring)."""
    report = SharedReport()
    history = _read(events, report)
    messages = history.messages
    # key -> the first copy at each member: (index, member, index of its end or None)
    firsts: dict[Key, list[tuple[int, str, int | None, Delivered]]] = defaultdict(list)
    dropped: dict[Key, int] = {}  # QoS 2 message -> index of the end that dropped it
    for subscriber, joined in history.subscribed.items():
        lost_session = _sessions_lost(report, subscriber, history, joined)
        ends = [index for index, _ in history.ends.get(subscriber, [])]
        for index, ended in history.ends.get(subscriber, []):
            report.ended += 1
            for key in ended.dropped:
                dropped.setdefault(key, index)
        sessions: dict[int, list[Delivered]] = defaultdict(list)
        seen: dict[int, set[Key]] = defaultdict(set)
        for index, delivery in history.deliveries.get(subscriber, []):
            session = bisect.bisect_left(ends, index)  # ends passed before this delivery
            key = (delivery.publisher, delivery.seq)
            if key in messages and key not in seen[session]:
                seen[session].add(key)
                end = ends[session] if session < len(ends) else None
                firsts[key].append((index, f"{subscriber}#{session + 1}", end, delivery))
            sessions[session].append(delivery)
        for session, delivered in sessions.items():
            _duplicates(report, f"{subscriber}#{session + 1}", delivered, messages,
                        lost_session)
    report.dropped = len(dropped)
    for key, copies in firsts.items():
        _across_members(report, history, key, copies, dropped.get(key))
    joined = min(history.subscribed.values(), default=len(events))
    unseen = _held_unsent(history)
    for key, message in messages.items():
        if (message.ack is not None and message.first_attempt > joined and
                key not in history.received and key not in dropped):
            if message.qos == 2 and unseen(key, message):
                report.dropped_unseen += 1
            else:
                _lost(report, "the group", key, message)
    return report


def _held_unsent(history: _History) -> Callable[[Key, _Message], bool]:
    """Whether an acknowledged message no member received may have been held unsent by a
    member whose session ended: some Ended event E came after its acknowledgement, and no
    message of its publisher first attempted after that acknowledgement reached a member
    before E."""
    ends = sorted(index for ended in history.ends.values() for index, _ in ended)
    first_copy: dict[Key, int] = {}
    for delivered in history.deliveries.values():
        for index, delivery in delivered:
            key = (delivery.publisher, delivery.seq)
            first_copy[key] = min(index, first_copy.get(key, index))
    never = 1 << 62
    # Per publisher, its messages by first Attempt: those indices, and from each message on
    # the earliest first copy of any of them.
    starts: dict[str, list[int]] = defaultdict(list)
    earliest: dict[str, list[int]] = defaultdict(list)
    for (publisher, seq), message in sorted(history.messages.items(),
                                            key=lambda item: item[1].first_attempt):
        starts[publisher].append(message.first_attempt)
        earliest[publisher].append(first_copy.get((publisher, seq), never))
    for copies in earliest.values():
        copies.append(never)
        for at in range(len(copies) - 2, -1, -1):
            copies[at] = min(copies[at], copies[at + 1])

    def held(key: Key, message: _Message) -> bool:
        assert message.ack is not None
        at = bisect.bisect_right(ends, message.ack)
        later = bisect.bisect_right(starts[key[0]], message.ack)
        return at < len(ends) and ends[at] < earliest[key[0]][later]

    return held


def _across_members(report: SharedReport, history: _History, key: Key,
                    copies: list[tuple[int, str, int | None, Delivered]],
                    dropped_at: int | None) -> None:
    """The first copies of one message at each member (in history order), and the index of
    the end that dropped it if an ended member held it (QoS 2)."""
    message = history.messages[key]
    name = f"{key[0]}:{key[1]}"
    copies = sorted(copies, key=lambda copy: copy[0])
    if len(message.attempts) > 1:  # two PUBLISHes for the broker: each to one member
        report.resend_doubled += max(len(copies) - 1, 0)
        return
    if message.qos == 2:
        for index, member, _end, _delivery in copies[1:] if dropped_at is None else copies:
            report.qos2_doubled += 1
            report.example("qos2_doubled", f"{member} got QoS 2 {name} (event {index}), which "
                           + (f"{copies[0][1]} got too (event {copies[0][0]})"
                              if dropped_at is None else
                              f"an ended member dropped (event {dropped_at})"))
        return
    for position in range(1, len(copies)):
        index, member, _end, delivery = copies[position]
        earlier = copies[:position]
        holder = next((c for c in earlier if c[2] is None or c[2] > index), None)
        if holder is not None:
            report.doubled += 1
            report.example("doubled", f"{member} got {name} (event {index}) while"
                           f" {holder[1]} had it (event {holder[0]}) and its session")
            continue
        report.redelivered += 1  # every earlier member's session ended before
        since = max(end for _, _, end, _ in earlier if end is not None)
        if delivery.dup and not any(since < at < index for at, _ in
                                    history.connects.get(delivery.subscriber, [])):
            report.wrong_dup += 1
            report.example("wrong_dup", f"{member} got {name} with DUP (event {index}), its"
                           f" first copy since the session of {earlier[-1][1]} ended")


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
