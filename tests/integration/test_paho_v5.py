"""paho-mqtt with MQTT 5.0 features: subscription options, properties, topic aliases,
client limits, message expiry."""

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.integration.clients import (
    PROTOCOL_ERROR,
    payloads,
    props,
    publish_props,
    unique,
    wait_offline,
    wait_past,
)

pytestmark = pytest.mark.integration



# ---- MQTT 5 subscription options -----------------------------------------------------------------
def test_v5_retain_handling(paho_client, topic) -> None:
    name = f"{topic}/rh"
    paho_client().publish(name, b"kept", 1, retain=True)

    always = paho_client()
    always.subscribe(name, 1, retain_handling=0)
    always.subscribe(name, 1, retain_handling=0)  # re-subscribing sends it again
    assert [(m.payload, m.retain) for m in always.barrier()] == [(b"kept", True)] * 2

    if_new = paho_client()
    if_new.subscribe(name, 1, retain_handling=1)
    if_new.subscribe(name, 1, retain_handling=1)  # the subscription exists: nothing
    assert [(m.payload, m.retain) for m in if_new.barrier()] == [(b"kept", True)]

    never = paho_client()
    never.subscribe(name, 1, retain_handling=2)
    assert never.barrier() == []


def test_v5_retain_as_published(paho_client, topic) -> None:
    name = f"{topic}/rap"
    keep_flag = paho_client()
    keep_flag.subscribe(name, 1, retain_as_published=True)
    clear_flag = paho_client()
    clear_flag.subscribe(name, 1, retain_as_published=False)
    pub = paho_client()
    pub.publish(name, b"retained", 1, retain=True)
    pub.publish(name, b"plain", 1, retain=False)
    assert [(m.payload, m.retain) for m in keep_flag.wait_messages(2)] == [
        (b"retained", True), (b"plain", False)]
    assert [(m.payload, m.retain) for m in clear_flag.wait_messages(2)] == [
        (b"retained", False), (b"plain", False)]


def test_v5_no_local(paho_client, topic) -> None:
    name = f"{topic}/nl"
    local = paho_client()
    local.subscribe(name, 1, no_local=True)
    echo = paho_client()
    echo.subscribe(name, 1, no_local=False)
    local.publish(name, b"from local", 1)
    echo.publish(name, b"from echo", 1)
    # `echo` sees its own message (no_local off) and the other one ...
    assert sorted(payloads(echo.wait_messages(2))) == [b"from echo", b"from local"]
    # ... `local` sees only the other client's.
    local.wait_messages(1)
    assert payloads(local.barrier()) == [b"from echo"]


def test_v5_no_local_on_shared_subscription_is_protocol_error(paho_client, topic) -> None:
    client = paho_client()
    client.client.subscribe((f"$share/g/{topic}", SubscribeOptions(1, noLocal=True)))
    assert client.wait_disconnected() == PROTOCOL_ERROR  # MQTT-3.8.3-4


def test_v5_subscription_identifiers(paho_client, topic) -> None:
    sub = paho_client()
    sub.subscribe(f"{topic}/+", 1, sub_id=7)
    sub.subscribe(f"{topic}/#", 2, sub_id=300_000)  # needs a multi-byte varint
    sub.subscribe(f"{topic}/x/plain", 0)  # no identifier
    pub = paho_client()
    pub.publish(f"{topic}/x", b"both", 2)
    pub.publish(f"{topic}/x/y", b"hash only", 1)
    pub.publish(f"{topic}/x/plain", b"plain and hash", 1)
    got = {m.payload: m for m in sub.wait_messages(3)}  # QoS 2 arrives in paho on PUBREL
    both, hash_only, plain = got[b"both"], got[b"hash only"], got[b"plain and hash"]
    # Overlapping subscriptions: one delivery, highest QoS, every identifier (3.3.4).
    assert (both.payload, both.qos) == (b"both", 2)
    assert sorted(both.prop("SubscriptionIdentifier")) == [7, 300_000]
    assert hash_only.prop("SubscriptionIdentifier") == [300_000]
    assert plain.prop("SubscriptionIdentifier") == [300_000]
    assert sorted(payloads(sub.barrier())) == [b"both", b"hash only", b"plain and hash"]
    # Retained messages sent because of a subscription carry its identifier too.
    pub.publish(f"{topic}/r", b"retained", 1, retain=True)
    late = paho_client()
    late.subscribe(f"{topic}/r", 1, sub_id=42)
    (retained,) = late.barrier()
    assert retained.prop("SubscriptionIdentifier") == [42]


def test_v5_user_properties_in_order_with_duplicates(paho_client, topic) -> None:
    user = [("k", "1"), ("a", "x"), ("k", "2"), ("k", "1"), ("ключ", "значение ✓"), ("", "")]
    sub = paho_client()
    sub.subscribe(f"{topic}/up", 1)
    pub = paho_client()
    pub.publish(f"{topic}/up", b"p", 1, properties=publish_props(UserProperty=user))
    pub.publish(f"{topic}/up", b"q", 1, retain=True,
                properties=publish_props(UserProperty=list(reversed(user))))
    first, second = sub.wait_messages(2)
    assert first.prop("UserProperty") == user
    assert second.prop("UserProperty") == list(reversed(user))
    late = paho_client()
    late.subscribe(f"{topic}/up", 1)
    (retained,) = late.barrier()
    assert retained.prop("UserProperty") == list(reversed(user))


def test_v5_content_type_and_payload_format_forwarded(paho_client, topic) -> None:
    sub = paho_client()
    sub.subscribe(f"{topic}/ct", 2)
    pub = paho_client()
    pub.publish(f"{topic}/ct", b'{"a": 1}', 2, properties=publish_props(
        ContentType="application/json; charset=utf-8", PayloadFormatIndicator=1))
    pub.publish(f"{topic}/ct", b"\x00\x01", 2)
    with_props, without = sub.wait_messages(2)
    assert with_props.payload == b'{"a": 1}'
    assert with_props.prop("ContentType") == "application/json; charset=utf-8"
    assert with_props.prop("PayloadFormatIndicator") == 1
    assert without.prop("ContentType") is None
    assert without.prop("PayloadFormatIndicator") is None


def test_v5_request_response(paho_client, topic) -> None:
    requester = paho_client()
    responder = paho_client()
    reply_to = f"{topic}/reply/{requester.client_id}"
    requester.subscribe(reply_to, 1)
    responder.subscribe(f"{topic}/service", 1)
    for n in range(3):
        correlation = f"req-{n}".encode() + b"\x00\xff"
        requester.publish(f"{topic}/service", f"ask {n}".encode(), 1, properties=publish_props(
            ResponseTopic=reply_to, CorrelationData=correlation))
        request = responder.wait_messages(n + 1)[n]
        assert request.prop("ResponseTopic") == reply_to
        assert request.prop("CorrelationData") == correlation
        responder.publish(request.prop("ResponseTopic"), b"answer " + request.payload, 1,
                          properties=publish_props(CorrelationData=request.prop(
                              "CorrelationData")))
        response = requester.wait_messages(n + 1)[n]
        assert response.payload == f"answer ask {n}".encode()
        assert response.prop("CorrelationData") == correlation
        assert response.prop("ResponseTopic") is None


def test_v5_topic_alias_from_client(paho_client, topic) -> None:
    sub = paho_client()
    sub.subscribe(f"{topic}/#", 1)
    pub = paho_client()
    assert pub.connack.prop("TopicAliasMaximum") >= 2
    pub.publish(f"{topic}/one", b"set 1", 1, properties=publish_props(TopicAlias=1))
    pub.publish("", b"use 1", 1, properties=publish_props(TopicAlias=1))
    pub.publish(f"{topic}/two", b"set 2", 1, properties=publish_props(TopicAlias=2))
    pub.publish("", b"use 2", 1, properties=publish_props(TopicAlias=2))
    pub.publish(f"{topic}/three", b"remap 1", 1, properties=publish_props(TopicAlias=1))
    pub.publish("", b"use 1 again", 1, properties=publish_props(TopicAlias=1))
    got = [(m.topic, m.payload) for m in sub.wait_messages(6)]
    assert got == [
        (f"{topic}/one", b"set 1"), (f"{topic}/one", b"use 1"),
        (f"{topic}/two", b"set 2"), (f"{topic}/two", b"use 2"),
        (f"{topic}/three", b"remap 1"), (f"{topic}/three", b"use 1 again"),
    ]
    # The alias is the publisher's business: subscribers never see it (paho did not ask).
    assert all(m.prop("TopicAlias") is None for m in sub.messages)


def test_v5_client_maximum_packet_size_respected(paho_client, topic) -> None:
    small = paho_client(properties=props(PacketTypes.CONNECT, MaximumPacketSize=128))
    small.subscribe(f"{topic}/mps", 1)
    pub = paho_client()
    pub.publish(f"{topic}/mps", b"fits", 1)
    pub.publish(f"{topic}/mps", b"x" * 200, 1)  # larger than the client accepts: not sent
    pub.publish(f"{topic}/mps", b"fits too", 1)
    small.wait_messages(2)
    assert payloads(small.barrier()) == [b"fits", b"fits too"]
    assert small.connected


# ---- message expiry ----------------------------------------------------------------------------
def test_v5_forwarded_message_carries_remaining_expiry(paho_client, topic) -> None:
    sub = paho_client()
    sub.subscribe(f"{topic}/mei", 1)
    pub = paho_client()
    pub.publish(f"{topic}/mei", b"expiring", 1, properties=publish_props(
        MessageExpiryInterval=60))
    pub.publish(f"{topic}/mei", b"forever", 1)
    expiring, forever = sub.wait_messages(2)
    assert 55 <= expiring.prop("MessageExpiryInterval") <= 60
    assert forever.prop("MessageExpiryInterval") is None


def test_v5_retained_message_expires(paho_client, topic) -> None:
    pub = paho_client()
    pub.publish(f"{topic}/short", b"short-lived", 1, retain=True,
                properties=publish_props(MessageExpiryInterval=1))
    published_at = time.time()
    pub.publish(f"{topic}/long", b"long-lived", 1, retain=True,
                properties=publish_props(MessageExpiryInterval=600))
    early = paho_client()
    early.subscribe(f"{topic}/#", 1)
    got = {m.topic: m for m in early.barrier()}
    assert sorted(got) == [f"{topic}/long", f"{topic}/short"]
    assert got[f"{topic}/short"].prop("MessageExpiryInterval") == 1
    assert 590 <= got[f"{topic}/long"].prop("MessageExpiryInterval") <= 600

    wait_past(published_at + 1.05)  # the one thing that has to take time: the expiry itself
    late = paho_client()
    late.subscribe(f"{topic}/#", 1)
    assert [(m.topic, m.payload) for m in late.barrier()] == [(f"{topic}/long", b"long-lived")]


def test_v5_queued_message_expires_while_offline(paho_client, shared_broker, topic) -> None:
    client_id = unique("offline")
    sub = paho_client(client_id, session_expiry=60)
    sub.subscribe(f"{topic}/q", 1)
    sub.disconnect()
    wait_offline(shared_broker.ports["http"], client_id)
    pub = paho_client()
    pub.publish(f"{topic}/q", b"expires", 1, properties=publish_props(MessageExpiryInterval=1))
    published_at = time.time()
    pub.publish(f"{topic}/q", b"has time", 1, properties=publish_props(
        MessageExpiryInterval=30))
    pub.publish(f"{topic}/q", b"no expiry", 1)
    wait_past(published_at + 1.05)
    back = paho_client(client_id, clean_start=False, session_expiry=60)
    assert back.connack.session_present is True
    has_time, no_expiry = back.wait_messages(2)
    assert (has_time.payload, no_expiry.payload) == (b"has time", b"no expiry")
    assert 1 <= has_time.prop("MessageExpiryInterval") <= 29  # reduced by the time queued
    assert no_expiry.prop("MessageExpiryInterval") is None
    assert payloads(back.barrier()) == [b"has time", b"no expiry"]
