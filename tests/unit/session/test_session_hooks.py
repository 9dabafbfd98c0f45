"""A memory session: what the packet handlers' hooks change, and what an idle one costs."""

import tracemalloc

from broker.session.message import Message
from broker.session.session import Delivery, Session, SubscriptionOptions

# A fresh session once cost ~1,550 bytes, 1,320 of them its empty queue, sets and dicts.
IDLE_SESSION_BYTES = 512


def session(max_queue: int = 0) -> Session:
    return Session("client", 60, max_queue, False)


def delivery(qos: int = 1) -> Delivery:
    return Delivery(Message("t", b"x", qos, False, "publisher", {}), qos, False)


def test_an_idle_session_costs_little_and_reading_it_costs_nothing() -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        sessions = [Session(f"idle-{i:05d}", 0, 1000, False) for i in range(1000)]
        made = tracemalloc.take_snapshot()
        for idle in sessions:  # what gauges, the API and a PUBACK ask of every session
            assert idle.queued == 0 and not idle.rel_arrived(1)
            idle.finish(1)
        read = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    per_session = sum(s.size_diff for s in made.compare_to(before, "lineno")) / 1000
    assert per_session < IDLE_SESSION_BYTES
    assert sum(s.size_diff for s in read.compare_to(made, "lineno")) < 1000


def test_a_memory_session_routes_its_subscriptions() -> None:
    s = session()
    options = SubscriptionOptions(1)
    assert s.subscribe("a/#", options) is False  # routed, not read from storage
    assert s.subscriptions == {"a/#": options}
    assert s.unsubscribe("a/#") is False
    assert s.subscriptions == {}


def test_an_incoming_qos2_message_is_owned_until_its_pubrel() -> None:
    s = session()
    assert s.rel_awaited(7) is None  # nothing to wait for before the PUBREC
    assert 7 in s.awaiting_rel
    assert s.rel_arrived(7) is True
    assert s.rel_arrived(7) is False  # the identifier is free again
    assert s.awaiting_rel == set()


def test_an_outgoing_qos2_delivery_awaits_pubcomp_once_released() -> None:
    s = session()
    sent = delivery(2)
    packet_id = s.next_packet_id()
    s.inflight[packet_id] = sent
    assert s.released(packet_id) is None
    assert s.awaiting_comp == {packet_id}
    s.finish(packet_id)
    assert s.awaiting_comp == set() and s.inflight == {}


def test_the_queue_drops_its_oldest_past_its_limit() -> None:
    s = session(max_queue=2)
    first, second, third = delivery(), delivery(), delivery()
    assert s.enqueue(first) is None and s.enqueue(second) is None
    assert s.enqueue(third) == "queue_full"
    assert list(s.queue) == [second, third] and s.queued == 2


def test_an_offline_session_does_not_queue_qos0() -> None:
    s = session()
    assert s.enqueue(delivery(0)) == "offline_qos0"
    assert s.queued == 0
