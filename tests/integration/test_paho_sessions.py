"""paho-mqtt sessions: persistence in memory, resumption, expiry, takeover, will messages.

Messages meant for an offline session are published only after `wait_offline()`: the broker
must have seen the DISCONNECT, or they would go to the closing connection instead.
"""

import time

import pytest
from paho.mqtt.packettypes import PacketTypes

from tests.integration.clients import (
    BOTH,
    DISCONNECT_WITH_WILL,
    NO_MATCHING_SUBSCRIBERS,
    SESSION_TAKEN_OVER,
    SUCCESS,
    PahoClient,
    api_client,
    payloads,
    props,
    unique,
    wait_offline,
    wait_until,
)

pytestmark = pytest.mark.integration


# ---- sessions ----------------------------------------------------------------------------------
def test_v5_session_resumed_with_queued_messages(paho_client, shared_broker, topic) -> None:
    client_id = unique("persist")
    first = paho_client(client_id, clean_start=True, session_expiry=60)
    assert first.connack.session_present is False
    first.subscribe(f"{topic}/q", 1, sub_id=9)
    first.disconnect()
    wait_offline(shared_broker.ports["http"], client_id)
    pub = paho_client()
    sent = [f"offline-{i}".encode() for i in range(5)]
    for payload in sent:
        # Routed to the offline session, so the publisher hears "success".
        assert pub.publish(f"{topic}/q", payload, 1) == SUCCESS
    view = api_client(shared_broker.ports["http"], client_id)
    assert view is not None
    # Durable by default (expiry > 0): the backlog is in Durable Storage, not in a queue.
    assert (view["connected"], view["durable"], view["subscriptions_cnt"]) == (False, True, 1)

    back = paho_client(client_id, clean_start=False, session_expiry=60)
    assert back.connack.session_present is True
    received = back.wait_messages(5)
    assert payloads(received) == sent
    assert all(m.qos == 1 for m in received)
    # Queued deliveries keep what the subscription added: its identifier.
    assert all(m.prop("SubscriptionIdentifier") == [9] for m in received)
    # The subscription came back with the session.
    pub.publish(f"{topic}/q", b"live", 1)
    assert back.wait_messages(6)[5].payload == b"live"


def test_v311_persistent_session(paho_client, shared_broker, topic) -> None:
    client_id = unique("v3persist")
    first = paho_client(client_id, version=4, clean_session=False)
    assert first.connack.session_present is False
    first.subscribe(f"{topic}/q", 2)
    first.disconnect()
    wait_offline(shared_broker.ports["http"], client_id)
    pub = paho_client(version=4)
    for n in range(3):
        pub.publish(f"{topic}/q", f"queued {n}".encode(), 1 + n % 2)
    back = paho_client(client_id, version=4, clean_session=False)
    assert back.connack.session_present is True
    assert sorted(payloads(back.wait_messages(3))) == [b"queued 0", b"queued 1", b"queued 2"]
    back.disconnect()
    # clean session = 1 throws the session away, and its subscription with it.
    fresh = paho_client(client_id, version=4, clean_session=True)
    assert fresh.connack.session_present is False
    pub.publish(f"{topic}/q", b"nobody listens", 1)
    assert fresh.barrier() == []


def test_v5_clean_start_discards_session(paho_client, shared_broker, topic) -> None:
    client_id = unique("clean")
    first = paho_client(client_id, session_expiry=60)
    first.subscribe(f"{topic}/q", 1)
    first.disconnect()
    wait_offline(shared_broker.ports["http"], client_id)
    pub = paho_client()
    pub.publish(f"{topic}/q", b"queued", 1)
    fresh = paho_client(client_id, clean_start=True, session_expiry=60)
    assert fresh.connack.session_present is False
    assert pub.publish(f"{topic}/q", b"after", 1) == NO_MATCHING_SUBSCRIBERS
    assert fresh.barrier() == []


def test_v5_session_without_expiry_ends_at_disconnect(paho_client, shared_broker) -> None:
    client_id = unique("noexpiry")
    paho_client(client_id, session_expiry=0).disconnect()
    wait_until(lambda: api_client(shared_broker.ports["http"], client_id) is None,
               what="session to end")
    again = paho_client(client_id, clean_start=False)
    assert again.connack.session_present is False


def test_v5_session_expires_after_interval(paho_client, shared_broker, topic) -> None:
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will", 1)
    client_id = unique("expiring")
    # A will delayed longer than the session lives goes out when the session ends.
    client = paho_client(client_id, session_expiry=1, will={
        "topic": f"{topic}/will", "payload": b"session over", "qos": 1,
        "properties": props(PacketTypes.WILLMESSAGE, WillDelayInterval=3600)})
    client.kill()
    disconnected_at = time.time()
    assert api_client(shared_broker.ports["http"], client_id) is not None  # kept for now
    wait_until(lambda: api_client(shared_broker.ports["http"], client_id) is None,
               timeout=3, what="session expiry")
    assert time.time() - disconnected_at >= 0.9
    assert payloads(watcher.wait_messages(1)) == [b"session over"]
    again = paho_client(client_id, clean_start=False, session_expiry=1)
    assert again.connack.session_present is False


def test_v5_disconnect_can_end_session_early(paho_client, shared_broker) -> None:
    client_id = unique("shorten")
    client = paho_client(client_id, session_expiry=3600)
    client.disconnect(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0))
    wait_until(lambda: api_client(shared_broker.ports["http"], client_id) is None,
               what="session to end on DISCONNECT with expiry 0")
    assert paho_client(client_id, clean_start=False).connack.session_present is False


def test_v5_unacknowledged_message_resent_with_dup(paho_client, topic) -> None:
    client_id = unique("dup")
    sub = paho_client(client_id, session_expiry=60, manual_ack=True)
    sub.subscribe(f"{topic}/d", 1)
    pub = paho_client()
    pub.publish(f"{topic}/d", b"ack me", 1)
    (first,) = sub.wait_messages(1)
    assert first.dup is False
    sub.disconnect()  # without PUBACK
    back = paho_client(client_id, clean_start=False, session_expiry=60)
    assert back.connack.session_present is True
    (again,) = back.wait_messages(1)
    assert (again.payload, again.qos, again.dup) == (b"ack me", 1, True)
    back.disconnect()
    # Acknowledged now: a third connection gets nothing more.
    third = paho_client(client_id, clean_start=False, session_expiry=60)
    assert third.connack.session_present is True
    assert third.barrier() == []


def _offline_with_three_unacknowledged(paho_client, shared_broker, topic: str,
                                       name: str) -> tuple[str, PahoClient]:
    """A durable session that received "sent 0..2" on `topic`, acknowledged none and went
    offline: (its client ID, the publisher)."""
    client_id = unique(name)
    sub = paho_client(client_id, session_expiry=60, manual_ack=True)
    sub.subscribe(topic, 1)
    pub = paho_client()
    for n in range(3):
        pub.publish(topic, f"sent {n}".encode(), 1)
    sub.wait_messages(3)
    sub.disconnect()
    wait_offline(shared_broker.ports["http"], client_id)
    return client_id, pub


def test_v5_resume_resends_inflight_before_queued(paho_client, shared_broker, topic) -> None:
    client_id, pub = _offline_with_three_unacknowledged(paho_client, shared_broker,
                                                        f"{topic}/o", "order")
    for n in range(3):
        pub.publish(f"{topic}/o", f"queued {n}".encode(), 1)
    back = paho_client(client_id, clean_start=False, session_expiry=60)
    received = back.wait_messages(6)
    assert [(m.payload, m.dup) for m in received] == [
        (b"sent 0", True), (b"sent 1", True), (b"sent 2", True),
        (b"queued 0", False), (b"queued 1", False), (b"queued 2", False)]


def test_v5_resends_past_a_smaller_receive_maximum_still_carry_dup(paho_client, shared_broker,
                                                                    topic) -> None:
    """Three unacknowledged, then the client comes back allowing one in flight: the two the
    window defers are resends too (MQTT-3.3.1-1), DUP set when they finally go."""
    client_id, _ = _offline_with_three_unacknowledged(paho_client, shared_broker,
                                                      f"{topic}/w", "window")
    back = paho_client(client_id, clean_start=False, session_expiry=60,
                       properties=props(PacketTypes.CONNECT, ReceiveMaximum=1))
    received = back.wait_messages(3)
    assert [(m.payload, m.dup) for m in received] == [
        (b"sent 0", True), (b"sent 1", True), (b"sent 2", True)]


def test_v5_disconnect_extending_zero_expiry_is_protocol_error(paho_client, shared_broker,
                                                              topic) -> None:
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will", 1)
    client = paho_client(session_expiry=0, will={"topic": f"{topic}/will", "payload": b"w"})
    # MQTT-3.14.2-2: a session that was to end at disconnect cannot be extended now ...
    client.disconnect(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=60))
    # ... so this is no normal disconnect: the will goes out and the session still ends.
    assert payloads(watcher.wait_messages(1)) == [b"w"]
    wait_until(lambda: api_client(shared_broker.ports["http"], client.client_id) is None,
               what="the session to end")


def test_v5_qos2_exactly_once_across_reconnect(paho_client, shared_broker, topic) -> None:
    """PUBREC received, PUBCOMP not yet: on resume the broker must send PUBREL again (not
    the message), so the application still sees it exactly once."""
    http = shared_broker.ports["http"]
    client_id = unique("qos2")
    sub = paho_client(client_id, session_expiry=60, manual_ack=True)  # PUBCOMP held back
    sub.subscribe(f"{topic}/x", 2)
    paho_client().publish(f"{topic}/x", b"exactly once", 2)
    assert payloads(sub.wait_messages(1)) == [b"exactly once"]
    assert api_client(http, client_id)["inflight_cnt"] == 1
    sub.disconnect()
    back = paho_client(client_id, clean_start=False, session_expiry=60)
    assert back.connack.session_present is True
    wait_until(lambda: api_client(http, client_id)["inflight_cnt"] == 0,
               what="PUBREL resent and PUBCOMP received")
    assert back.barrier() == []


def test_v5_receive_maximum_limits_inflight(paho_client, shared_broker, topic) -> None:
    sub = paho_client(properties=props(PacketTypes.CONNECT, ReceiveMaximum=2), manual_ack=True)
    sub.subscribe(f"{topic}/rm", 1)
    pub = paho_client()
    for n in range(5):
        pub.publish(f"{topic}/rm", f"m{n}".encode(), 1)
    window = sub.wait_messages(2)
    assert payloads(sub.barrier()) == [b"m0", b"m1"]  # no more than 2 unacknowledged
    view = api_client(shared_broker.ports["http"], sub.client_id)
    assert (view["inflight_cnt"], view["mqueue_len"]) == (2, 3)
    sub.ack(window[0].mid, 1)
    assert sub.wait_messages(3)[2].payload == b"m2"
    assert payloads(sub.barrier()) == [b"m0", b"m1", b"m2"]
    for message in sub.wait_messages(3)[1:]:
        sub.ack(message.mid, 1)
    assert payloads(sub.wait_messages(5)) == [b"m0", b"m1", b"m2", b"m3", b"m4"]


# ---- session takeover --------------------------------------------------------------------------
def test_v5_session_takeover(paho_client, topic) -> None:
    client_id = unique("takeover")
    first = paho_client(client_id, session_expiry=60)
    first.subscribe(f"{topic}/t", 1)
    second = paho_client(client_id, clean_start=False, session_expiry=60)
    assert first.wait_disconnected() == SESSION_TAKEN_OVER
    assert second.connack.session_present is True
    pub = paho_client()
    pub.publish(f"{topic}/t", b"to the new owner", 1)
    assert payloads(second.wait_messages(1)) == [b"to the new owner"]
    assert first.messages == []


def test_v311_session_takeover_closes_old_connection(paho_client, shared_broker) -> None:
    client_id = unique("takeover3")
    first = paho_client(client_id, version=4)
    second = paho_client(client_id, version=4)
    first.wait_disconnected()
    assert not first.connected
    assert second.connected
    view = api_client(shared_broker.ports["http"], client_id)
    assert view is not None and view["connected"] is True


# ---- will messages -----------------------------------------------------------------------------
@BOTH
def test_will_sent_when_connection_dies(paho_client, topic, version) -> None:
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will", 1)
    will: dict = {"topic": f"{topic}/will", "payload": b"gone", "qos": 1}
    if version == 5:
        will["properties"] = props(PacketTypes.WILLMESSAGE, ContentType="text/plain",
                                   UserProperty=[("why", "crash")])
    doomed = paho_client(version=version, will=will)
    doomed.kill()
    (message,) = watcher.wait_messages(1)
    assert (message.topic, message.payload, message.qos) == (f"{topic}/will", b"gone", 1)
    if version == 5:
        assert message.prop("ContentType") == "text/plain"
        assert message.prop("UserProperty") == [("why", "crash")]


@BOTH
def test_no_will_on_normal_disconnect(paho_client, shared_broker, topic, version) -> None:
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will", 1)
    polite = paho_client(version=version, will={"topic": f"{topic}/will", "payload": b"no"})
    polite.disconnect()
    wait_until(lambda: api_client(shared_broker.ports["http"], polite.client_id) is None,
               what="the broker to process the DISCONNECT")
    assert watcher.barrier() == []


def test_v5_will_sent_on_disconnect_with_will_message(paho_client, topic) -> None:
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will", 1)
    client = paho_client(will={"topic": f"{topic}/will", "payload": b"asked for", "qos": 1})
    client.disconnect(reason_code=DISCONNECT_WITH_WILL)
    (message,) = watcher.wait_messages(1)
    assert message.payload == b"asked for"


def test_v5_retained_will(paho_client, topic) -> None:
    doomed = paho_client(will={"topic": f"{topic}/status", "payload": b"offline", "qos": 1,
                               "retain": True})
    watcher = paho_client()
    watcher.subscribe(f"{topic}/status", 1)
    doomed.kill()
    assert [(m.payload, m.retain) for m in watcher.wait_messages(1)] == [(b"offline", False)]
    late = paho_client()
    late.subscribe(f"{topic}/status", 1)
    assert [(m.payload, m.retain) for m in late.barrier()] == [(b"offline", True)]


def test_v5_will_delay_cancelled_by_reconnect_or_takeover(paho_client, shared_broker,
                                                          topic) -> None:
    http = shared_broker.ports["http"]
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will/#", 1)

    def will(name: str) -> dict:
        return {"topic": f"{topic}/will/{name}", "payload": name.encode(), "qos": 1,
                "properties": props(PacketTypes.WILLMESSAGE, WillDelayInterval=1)}

    resumer = paho_client(unique("resumer"), session_expiry=60, will=will("resumer"))
    taken = paho_client(unique("taken"), session_expiry=60, will=will("taken"))
    control = paho_client(unique("control"), session_expiry=60, will=will("control"))
    resumer.kill()
    wait_until(lambda: not api_client(http, resumer.client_id)["connected"],
               what="the broker to notice the lost connection")
    # A second connection takes the session over: the old one closes without DISCONNECT,
    # but the session continues at once, so its delayed will must not go out either.
    new_owner = paho_client(taken.client_id, clean_start=False, session_expiry=60)
    assert taken.wait_disconnected() == SESSION_TAKEN_OVER
    assert new_owner.connack.session_present is True
    control.kill()  # lost last: its delayed will is due after the other two would have been
    back = paho_client(resumer.client_id, clean_start=False, session_expiry=60)
    assert back.connack.session_present is True
    # The control's will proves the delay has passed for the others as well.
    (message,) = watcher.wait_messages(1, timeout=5)
    assert message.topic == f"{topic}/will/control"
    assert [m.topic for m in watcher.barrier()] == [f"{topic}/will/control"]


def test_v5_will_delay_bounded_by_session_expiry(paho_client, topic) -> None:
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will", 1)
    doomed = paho_client(session_expiry=0, will={
        "topic": f"{topic}/will", "payload": b"now", "qos": 1,
        "properties": props(PacketTypes.WILLMESSAGE, WillDelayInterval=3600)})
    doomed.kill()
    # The session ends at once (expiry 0), so the will cannot wait an hour (3.1.3.2.2).
    assert payloads(watcher.wait_messages(1)) == [b"now"]
