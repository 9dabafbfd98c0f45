"""paho-mqtt (MQTT 3.1.1 and 5.0) against the real broker process over TCP.

Absence of a delivery is proven with `barrier()` (a SUBSCRIBE round trip on the receiving
connection) after the publisher's own acknowledgement, never by waiting for a while.
"""

import socket
import time
from collections.abc import Iterator

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.integration.clients import (
    PINGREQ,
    PINGRESP,
    api_client,
    props,
    publish_props,
    raw_connect,
    raw_subscribe,
    recv_packet,
    scrape_metrics,
    unique,
    wait_past,
    wait_until,
)
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

# One broker for every test of a non-default limit (startup is the slow part); none of these
# settings gets in the way of another's test.
LIMITS = {
    "mqtt.max_qos_allowed": "1",
    "mqtt.max_topic_alias": "2",
    "mqtt.max_mqueue_len": "3",
    "mqtt.mqueue_store_qos0": "false",
    "mqtt.max_session_expiry_interval": "100s",
    "mqtt.max_packet_size": "2KB",
    "retainer.max_payload_size": "16",
    "mqtt.wildcard_subscription": "false",
    "mqtt.shared_subscription": "false",
    "mqtt.max_clientid_len": "40",
    "mqtt.max_topic_levels": "8",
}


@pytest.fixture(scope="module")
def limited_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("limited"), dict(LIMITS)).start()
    yield process
    process.kill()

BOTH = pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])

# Reason codes (MQTT 5.0 section 2.4) as paho reports them.
SUCCESS = 0
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
SESSION_TAKEN_OVER = 0x8E
PAYLOAD_FORMAT_INVALID = 0x99
DISCONNECT_WITH_WILL = 0x04


def payloads(messages: list) -> list[bytes]:
    return [m.payload for m in messages]


# ---- connecting ------------------------------------------------------------------------------
@BOTH
def test_connect_new_session(paho_client, shared_broker: BrokerProcess, version: int) -> None:
    client = paho_client(version=version)
    assert client.connack is not None
    assert client.connack.reason_code == 0
    assert client.connack.session_present is False
    view = api_client(shared_broker.ports["http"], client.client_id)
    assert view is not None and view["connected"] is True
    assert view["proto_ver"] == version


def test_v5_connack_advertises_limits(paho_client) -> None:
    result = paho_client().connack
    assert result.prop("ReceiveMaximum") == 32
    assert result.prop("MaximumPacketSize") == 1024 * 1024
    assert result.prop("TopicAliasMaximum") == 65535
    assert result.prop("RetainAvailable") == 1
    assert result.prop("SharedSubscriptionAvailable") == 1
    assert result.prop("SubscriptionIdentifierAvailable") == 1
    assert result.prop("AssignedClientIdentifier") is None  # we sent an ID


def test_v5_empty_client_id_gets_assigned_identifier(paho_client, shared_broker) -> None:
    first = paho_client("")
    second = paho_client("")
    assigned = first.connack.prop("AssignedClientIdentifier")
    other = second.connack.prop("AssignedClientIdentifier")
    assert assigned and other and assigned != other
    view = api_client(shared_broker.ports["http"], assigned)
    assert view is not None and view["connected"] is True
    # The assigned ID is really the client's: messages reach it under that session.
    first.subscribe(f"assigned/{assigned}", 1)
    second.publish(f"assigned/{assigned}", b"hi", 1)
    assert payloads(first.wait_messages(1)) == [b"hi"]


def test_v311_empty_client_id_needs_clean_session(paho_client, shared_broker) -> None:
    accepted = paho_client("", version=4)
    assert accepted.connack.reason_code == 0
    # paho refuses to send this combination, so a raw CONNECT does (MQTT-3.1.3-8).
    sock, connack = raw_connect(shared_broker.tcp, "", keepalive=10, version=4, clean=False)
    sock.close()
    assert connack == b"\x20\x02\x00\x02"  # identifier rejected


# ---- QoS end to end ----------------------------------------------------------------------------
@BOTH
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_subscribe_exact_payloads_in_order(paho_client, topic, version, qos) -> None:
    sub = paho_client(version=version)
    pub = paho_client(version=version)
    assert sub.subscribe(f"{topic}/q", qos) == [qos]
    sent = [f"msg-{i}".encode() for i in range(20)]
    sent += [b"", bytes(range(256)), "ünïcødé ✓".encode(), b"x" * 70_000]
    for payload in sent:
        pub.publish(f"{topic}/q", payload, qos)
    received = sub.wait_messages(len(sent))
    assert payloads(received) == sent
    assert {(m.topic, m.qos, m.retain, m.dup) for m in received} == {(f"{topic}/q", qos, False,
                                                                       False)}
    assert payloads(sub.barrier()) == sent  # and nothing twice


def test_cross_version_delivery(paho_client, topic) -> None:
    v3 = paho_client(version=4)
    v5 = paho_client(version=5)
    v3.subscribe(f"{topic}/to3", 2)
    v5.subscribe(f"{topic}/to5", 2)
    v5.publish(f"{topic}/to3", b"from five", 2, properties=publish_props(ContentType="a/b"))
    v3.publish(f"{topic}/to5", b"from three", 2)
    (got3,) = v3.wait_messages(1)
    (got5,) = v5.wait_messages(1)
    assert (got3.topic, got3.payload, got3.qos) == (f"{topic}/to3", b"from five", 2)
    assert (got5.topic, got5.payload, got5.qos) == (f"{topic}/to5", b"from three", 2)


def test_delivered_qos_is_minimum_of_publish_and_subscription(paho_client, topic) -> None:
    low = paho_client()
    high = paho_client()
    low.subscribe(f"{topic}/m", 0)
    high.subscribe(f"{topic}/m", 2)
    pub = paho_client()
    pub.publish(f"{topic}/m", b"two", 2)
    pub.publish(f"{topic}/m", b"one", 1)
    # paho hands a QoS 2 message over on PUBREL, so compare per payload, not by order.
    assert {m.payload: m.qos for m in low.wait_messages(2)} == {b"two": 0, b"one": 0}
    assert {m.payload: m.qos for m in high.wait_messages(2)} == {b"two": 2, b"one": 1}


# ---- topic filters -----------------------------------------------------------------------------
def test_single_and_multi_level_wildcards(paho_client, topic) -> None:
    plus = paho_client()
    hash_ = paho_client()
    both = paho_client()
    plus.subscribe(f"{topic}/+/c", 1)
    hash_.subscribe(f"{topic}/#", 1)
    both.subscribe(f"{topic}/+/+", 1)
    pub = paho_client()
    topics = [f"{topic}/x/c", f"{topic}/x/y/c", f"{topic}/c", topic, f"{topic}//c",
              f"{topic}/x/d", f"{topic}x/x/c"]
    for name in topics:
        pub.publish(name, name.encode(), 1)
    pub.publish(f"{topic}/done", b"", 1)
    hash_.wait_message_on(f"{topic}/done")
    assert [m.topic for m in plus.barrier()] == [f"{topic}/x/c", f"{topic}//c"]
    assert [m.topic for m in hash_.barrier()] == [
        f"{topic}/x/c", f"{topic}/x/y/c", f"{topic}/c", topic, f"{topic}//c", f"{topic}/x/d",
        f"{topic}/done",
    ]
    assert [m.topic for m in both.barrier()] == [f"{topic}/x/c", f"{topic}//c", f"{topic}/x/d"]


def test_leading_slash_and_parent_level(paho_client, topic) -> None:
    base = topic.split("/", 1)[1]  # a unique first level
    lead = paho_client()
    lead.subscribe(f"+/{base}/x", 1)  # '+' matches the empty level before a leading '/'
    parent = paho_client()
    parent.subscribe(f"{topic}/a/#", 1)  # '#' includes the parent level itself
    pub = paho_client()
    pub.publish(f"/{base}/x", b"leading slash", 1)
    pub.publish(f"{topic}/a", b"parent", 1, retain=True)
    pub.publish(f"{topic}/a/b", b"child", 1)
    pub.publish(f"{topic}/ab", b"sibling", 1)
    assert [(m.topic, m.payload) for m in lead.wait_messages(1)] == [
        (f"/{base}/x", b"leading slash")]
    parent.wait_messages(2)
    assert payloads(parent.barrier()) == [b"parent", b"child"]
    late = paho_client()
    late.subscribe(f"{topic}/a/#", 1)  # retained at the parent level too
    assert [(m.topic, m.retain) for m in late.barrier()] == [(f"{topic}/a", True)]


@BOTH
@pytest.mark.parametrize("qos", [1, 2])
def test_non_ascii_topics(paho_client, topic, version, qos) -> None:
    """Multi-byte topic names: the packet identifier follows the topic's UTF-8 bytes."""
    names = [f"{topic}/ü", f"{topic}/温度/センサー", f"{topic}/🙂/" + "ж" * 100]
    sub = paho_client(version=version)
    sub.subscribe(f"{topic}/#", qos)
    pub = paho_client(version=version)
    for n, name in enumerate(names * 3):
        pub.publish(name, f"{n}".encode(), qos)
    received = sub.wait_messages(9)
    assert sorted((m.topic, m.payload) for m in received) == sorted(
        (name, f"{n}".encode()) for n, name in enumerate(names * 3))
    assert len(sub.barrier()) == 9


def test_dollar_topics_not_matched_by_leading_wildcards(paho_client, broker) -> None:
    # A broker of its own: a root '#' here must not see other tests' traffic.
    everything = paho_client(port=broker.tcp)
    plus = paho_client(port=broker.tcp)
    sys_sub = paho_client(port=broker.tcp)
    everything.subscribe("#", 1)
    plus.subscribe("+/x", 1)
    sys_sub.subscribe("$SYS/#", 1)
    pub = paho_client(port=broker.tcp)
    pub.publish("$SYS/x", b"sys", 1)
    pub.publish("m/x", b"plain", 1)
    assert [m.topic for m in sys_sub.wait_messages(1)] == ["$SYS/x"]
    everything.wait_message_on("m/x")
    assert [m.topic for m in everything.barrier()] == ["m/x"]
    assert [m.topic for m in plus.barrier()] == ["m/x"]
    # Retained messages follow the same rule on subscribe.
    pub.publish("$SYS/r", b"sys", 1, retain=True)
    pub.publish("r", b"plain", 1, retain=True)
    late = paho_client(port=broker.tcp)
    late.subscribe("#", 1)
    assert [(m.topic, m.retain) for m in late.barrier()] == [("r", True)]
    late_sys = paho_client(port=broker.tcp)
    late_sys.subscribe("$SYS/#", 1)
    assert [(m.topic, m.retain) for m in late_sys.barrier()] == [("$SYS/r", True)]


def test_resubscribe_replaces_options(paho_client, topic) -> None:
    sub = paho_client()
    sub.subscribe(f"{topic}/re", 0, sub_id=1)
    sub.subscribe(f"{topic}/re", 2, sub_id=2)  # same filter: replaces, does not add
    pub = paho_client()
    pub.publish(f"{topic}/re", b"once", 2)
    (message,) = sub.wait_messages(1)
    assert (message.qos, message.prop("SubscriptionIdentifier")) == (2, [2])
    assert payloads(sub.barrier()) == [b"once"]


def test_unsubscribe_stops_delivery(paho_client, topic) -> None:
    sub = paho_client()
    pub = paho_client()
    sub.subscribe(f"{topic}/u", 1)
    pub.publish(f"{topic}/u", b"before", 1)
    sub.wait_messages(1)
    assert sub.unsubscribe(f"{topic}/u", f"{topic}/never") == [SUCCESS, NO_SUBSCRIPTION_EXISTED]
    assert pub.publish(f"{topic}/u", b"after", 1) == NO_MATCHING_SUBSCRIBERS
    assert payloads(sub.barrier()) == [b"before"]


@BOTH
def test_invalid_filter_rejected_per_filter(shared_broker, topic, version) -> None:
    # paho will not send an invalid filter, so this one SUBSCRIBE is written by hand.
    sock, _ = raw_connect(shared_broker.tcp, unique("raw"), keepalive=10, version=version)
    with sock:
        codes = raw_subscribe(sock, 7, [(f"{topic}/ok", 1), (f"{topic}/a+b", 1),
                                         (f"{topic}/#/x", 0), (f"{topic}/+", 2)], version)
        # v5: 0x8F Topic Filter invalid per filter; v3.1.1 only knows 0x80 (failure).
        bad = 0x8F if version == 5 else 0x80
        assert codes == [1, bad, bad, 2]
        sock.sendall(PINGREQ)
        assert recv_packet(sock) == PINGRESP  # the connection survived the bad filters


# ---- v5 publish acknowledgements ---------------------------------------------------------------
def test_v5_puback_reports_no_matching_subscribers(paho_client, topic) -> None:
    pub = paho_client()
    assert pub.publish(f"{topic}/nobody", b"x", 1) == NO_MATCHING_SUBSCRIBERS
    sub = paho_client()
    sub.subscribe(f"{topic}/nobody", 0)
    assert pub.publish(f"{topic}/nobody", b"x", 1) == SUCCESS


def test_v5_invalid_utf8_with_payload_format_indicator_refused(paho_client, topic) -> None:
    sub = paho_client()
    sub.subscribe(f"{topic}/pfi", 1)
    pub = paho_client()
    bad = publish_props(PayloadFormatIndicator=1)
    assert pub.publish(f"{topic}/pfi", b"\xff\xfe", 1, properties=bad) == PAYLOAD_FORMAT_INVALID
    good = publish_props(PayloadFormatIndicator=1)
    assert pub.publish(f"{topic}/pfi", "ok ✓".encode(), 1, properties=good) == SUCCESS
    (message,) = sub.wait_messages(1)
    assert message.payload == "ok ✓".encode()
    assert message.prop("PayloadFormatIndicator") == 1
    assert payloads(sub.barrier()) == ["ok ✓".encode()]


# ---- retained messages ---------------------------------------------------------------------------
@BOTH
def test_retained_set_replace_delete(paho_client, topic, version) -> None:
    name = f"{topic}/state"
    live = paho_client(version=version)
    live.subscribe(name, 1)
    pub = paho_client(version=version)
    pub.publish(name, b"one", 1, retain=True)
    first = paho_client(version=version)
    first.subscribe(name, 1)
    assert [(m.payload, m.retain) for m in first.barrier()] == [(b"one", True)]

    pub.publish(name, b"two", 1, retain=True)
    second = paho_client(version=version)
    second.subscribe(name, 1)
    assert [(m.payload, m.retain) for m in second.barrier()] == [(b"two", True)]

    pub.publish(name, b"", 1, retain=True)  # empty payload: delete
    third = paho_client(version=version)
    third.subscribe(name, 1)
    assert third.barrier() == []
    # Subscribers that were already there get each publish live, without the retain flag
    # (MQTT-3.3.1-9 for v3.1.1; v5 without Retain As Published), the delete included.
    assert [(m.payload, m.retain) for m in live.wait_messages(3)] == [
        (b"one", False), (b"two", False), (b"", False)]


def test_retained_delivered_for_wildcard_with_min_qos(paho_client, topic) -> None:
    pub = paho_client()
    pub.publish(f"{topic}/a", b"qos0", 0, retain=True)
    pub.publish(f"{topic}/b/c", b"qos2", 2, retain=True)
    pub.publish(f"{topic}/b/d", b"qos1", 1, retain=True)
    sub = paho_client()
    sub.subscribe(f"{topic}/#", 1)
    got = {m.topic: (m.payload, m.qos, m.retain) for m in sub.barrier()}
    assert got == {f"{topic}/a": (b"qos0", 0, True), f"{topic}/b/c": (b"qos2", 1, True),
                   f"{topic}/b/d": (b"qos1", 1, True)}
    plus = paho_client()
    plus.subscribe(f"{topic}/b/+", 2)
    assert sorted((m.topic, m.qos) for m in plus.barrier()) == [
        (f"{topic}/b/c", 2), (f"{topic}/b/d", 1)]


def test_retained_survive_restart(paho_client, start_broker, tmp_path) -> None:
    data_dir = tmp_path / "restart"
    broker = start_broker(data_dir=data_dir)
    pub = paho_client(port=broker.tcp)
    user = [("origin", "before-restart"), ("k", "1"), ("k", "2")]
    pub.publish("keep/a", b"alpha", 1, retain=True,
                properties=publish_props(ContentType="text/x-alpha", UserProperty=user))
    pub.publish("keep/b", b"beta", 2, retain=True)
    pub.publish("keep/gone", b"deleted soon", 1, retain=True)
    pub.publish("keep/gone", b"", 1, retain=True)
    pub.publish("keep/a/plain", b"not retained", 1)
    pub.disconnect()
    assert broker.stop() == 0

    again = start_broker(data_dir=data_dir)
    sub = paho_client(port=again.tcp)
    sub.subscribe("keep/#", 2)
    got = {m.topic: m for m in sub.barrier()}
    assert sorted(got) == ["keep/a", "keep/b"]
    assert (got["keep/a"].payload, got["keep/a"].qos, got["keep/a"].retain) == (b"alpha", 1, True)
    assert got["keep/a"].prop("ContentType") == "text/x-alpha"
    assert got["keep/a"].prop("UserProperty") == user
    assert (got["keep/b"].payload, got["keep/b"].qos) == (b"beta", 2)


def test_retained_max_messages_allows_replace_not_new_topics(paho_client, start_broker) -> None:
    broker = start_broker(**{"retainer.max_retained_messages": "2"})
    live = paho_client(port=broker.tcp)
    live.subscribe("lim/#", 1)
    pub = paho_client(port=broker.tcp)
    pub.publish("lim/a", b"a1", 1, retain=True)
    pub.publish("lim/b", b"b1", 1, retain=True)
    pub.publish("lim/a", b"a2", 1, retain=True)  # replacing an existing topic is allowed
    pub.publish("lim/c", b"c1", 1, retain=True)  # a third topic is not stored ...
    # ... but still forwarded to current subscribers.
    assert payloads(live.wait_messages(4)) == [b"a1", b"b1", b"a2", b"c1"]
    sub = paho_client(port=broker.tcp)
    sub.subscribe("lim/#", 1)
    assert sorted((m.topic, m.payload) for m in sub.barrier()) == [
        ("lim/a", b"a2"), ("lim/b", b"b1")]
    # Deleting one makes room again.
    pub.publish("lim/b", b"", 1, retain=True)
    pub.publish("lim/c", b"c2", 1, retain=True)
    after = paho_client(port=broker.tcp)
    after.subscribe("lim/#", 1)
    assert sorted((m.topic, m.payload) for m in after.barrier()) == [
        ("lim/a", b"a2"), ("lim/c", b"c2")]


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


def test_v5_queued_message_expires_while_offline(paho_client, topic) -> None:
    client_id = unique("offline")
    sub = paho_client(client_id, session_expiry=60)
    sub.subscribe(f"{topic}/q", 1)
    sub.disconnect()
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


# ---- sessions ----------------------------------------------------------------------------------
def test_v5_session_resumed_with_queued_messages(paho_client, shared_broker, topic) -> None:
    client_id = unique("persist")
    first = paho_client(client_id, clean_start=True, session_expiry=60)
    assert first.connack.session_present is False
    first.subscribe(f"{topic}/q", 1)
    first.disconnect()
    pub = paho_client()
    sent = [f"offline-{i}".encode() for i in range(5)]
    for payload in sent:
        # Routed to the offline session, so the publisher hears "success".
        assert pub.publish(f"{topic}/q", payload, 1) == SUCCESS
    view = api_client(shared_broker.ports["http"], client_id)
    assert view is not None
    assert (view["connected"], view["mqueue_len"], view["subscriptions_cnt"]) == (False, 5, 1)

    back = paho_client(client_id, clean_start=False, session_expiry=60)
    assert back.connack.session_present is True
    received = back.wait_messages(5)
    assert payloads(received) == sent
    assert all(m.qos == 1 for m in received)
    # The subscription came back with the session.
    pub.publish(f"{topic}/q", b"live", 1)
    assert back.wait_messages(6)[5].payload == b"live"


def test_v311_persistent_session(paho_client, topic) -> None:
    client_id = unique("v3persist")
    first = paho_client(client_id, version=4, clean_session=False)
    assert first.connack.session_present is False
    first.subscribe(f"{topic}/q", 2)
    first.disconnect()
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


def test_v5_clean_start_discards_session(paho_client, topic) -> None:
    client_id = unique("clean")
    first = paho_client(client_id, session_expiry=60)
    first.subscribe(f"{topic}/q", 1)
    first.disconnect()
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


def test_v5_resume_resends_inflight_before_queued(paho_client, topic) -> None:
    client_id = unique("order")
    sub = paho_client(client_id, session_expiry=60, manual_ack=True)
    sub.subscribe(f"{topic}/o", 1)
    pub = paho_client()
    for n in range(3):
        pub.publish(f"{topic}/o", f"sent {n}".encode(), 1)
    sub.wait_messages(3)
    sub.disconnect()  # three deliveries unacknowledged
    for n in range(3):
        pub.publish(f"{topic}/o", f"queued {n}".encode(), 1)
    back = paho_client(client_id, clean_start=False, session_expiry=60)
    received = back.wait_messages(6)
    assert [(m.payload, m.dup) for m in received] == [
        (b"sent 0", True), (b"sent 1", True), (b"sent 2", True),
        (b"queued 0", False), (b"queued 1", False), (b"queued 2", False)]


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


# ---- shared subscriptions ----------------------------------------------------------------------
def test_shared_subscription_splits_messages(paho_client, topic) -> None:
    members = [paho_client(), paho_client()]
    for member in members:
        assert member.subscribe(f"$share/g/{topic}/work", 1) == [1]
    other_group = paho_client()
    other_group.subscribe(f"$share/h/{topic}/work", 1)
    plain = paho_client()
    plain.subscribe(f"{topic}/work", 1)
    pub = paho_client()
    sent = [f"job-{i}".encode() for i in range(10)]
    for payload in sent:
        pub.publish(f"{topic}/work", payload, 1)
    assert payloads(plain.wait_messages(10)) == sent
    assert payloads(other_group.wait_messages(10)) == sent  # one group, one member: all
    first, second = (payloads(member.barrier()) for member in members)
    assert sorted(first + second) == sorted(sent)  # each message to exactly one member
    assert first and second  # and both members took a share
    assert all(m.topic == f"{topic}/work" for m in members[0].messages + members[1].messages)


def test_shared_subscription_prefers_online_members(paho_client, topic) -> None:
    online = paho_client()
    online.subscribe(f"$share/g/{topic}/w", 1)
    offline_id = unique("member")
    offline = paho_client(offline_id, session_expiry=60)
    offline.subscribe(f"$share/g/{topic}/w", 1)
    offline.disconnect()  # keeps its session and its membership
    pub = paho_client()
    for n in range(6):
        pub.publish(f"{topic}/w", f"w{n}".encode(), 1)
    assert payloads(online.wait_messages(6)) == [f"w{n}".encode() for n in range(6)]
    back = paho_client(offline_id, clean_start=False, session_expiry=60)
    assert back.connack.session_present is True
    assert back.barrier() == []  # nothing was parked with the offline member


def test_shared_subscription_unsubscribe(paho_client, topic) -> None:
    leaving, staying = paho_client(), paho_client()
    for member in (leaving, staying):
        member.subscribe(f"$share/g/{topic}/u", 1)
    assert leaving.unsubscribe(f"$share/g/{topic}/u") == [SUCCESS]
    pub = paho_client()
    for n in range(4):
        pub.publish(f"{topic}/u", f"u{n}".encode(), 1)
    assert payloads(staying.wait_messages(4)) == [f"u{n}".encode() for n in range(4)]
    assert leaving.barrier() == []


def test_shared_subscription_gets_no_retained_messages(paho_client, topic) -> None:
    paho_client().publish(f"{topic}/r", b"retained", 1, retain=True)
    member = paho_client()
    member.subscribe(f"$share/g/{topic}/r", 1)
    assert member.barrier() == []
    plain = paho_client()
    plain.subscribe(f"{topic}/r", 1)
    assert payloads(plain.barrier()) == [b"retained"]


# ---- non-default limits (one broker for all, see LIMITS) ------------------------------------
def test_max_qos_allowed(paho_client, limited_broker) -> None:
    client = paho_client(port=limited_broker.tcp)
    assert client.connack.prop("MaximumQoS") == 1
    assert client.subscribe("capped/t", 2) == [1]  # granted QoS capped
    client.client.publish("capped/t", b"x", 2)
    assert client.wait_disconnected() == 0x9B  # QoS not supported


def test_retained_max_payload_size(paho_client, limited_broker) -> None:
    port = limited_broker.tcp
    both = [("size/small", 1), ("size/big", 1)]  # no wildcards on this broker
    live = paho_client(port=port)
    live.subscribe(both)
    pub = paho_client(port=port)
    pub.publish("size/small", b"s" * 16, 1, retain=True)
    pub.publish("size/big", b"b" * 17, 1, retain=True)
    assert payloads(live.wait_messages(2)) == [b"s" * 16, b"b" * 17]  # both forwarded
    sub = paho_client(port=port)
    sub.subscribe(both)
    assert [(m.topic, m.payload) for m in sub.barrier()] == [("size/small", b"s" * 16)]


def test_v5_topic_alias_limits(paho_client, limited_broker) -> None:
    pub = paho_client(port=limited_broker.tcp)
    assert pub.connack.prop("TopicAliasMaximum") == 2
    pub.publish("alias/t", b"ok", 1, properties=publish_props(TopicAlias=2))
    pub.client.publish("alias/t", b"x", 1, properties=publish_props(TopicAlias=3))
    assert pub.wait_disconnected() == 0x94  # Topic Alias invalid
    unset = paho_client(port=limited_broker.tcp)
    unset.client.publish("", b"x", 1, properties=publish_props(TopicAlias=1))
    assert unset.wait_disconnected() == 0x82  # alias never set: Protocol Error


def test_v5_session_expiry_capped_in_connack(paho_client, limited_broker) -> None:
    capped = paho_client(port=limited_broker.tcp, session_expiry=100_000)
    assert capped.connack.prop("SessionExpiryInterval") == 100
    within = paho_client(port=limited_broker.tcp, session_expiry=50)
    assert within.connack.prop("SessionExpiryInterval") is None  # granted as asked


def test_offline_queue_keeps_newest_and_skips_qos0(paho_client, limited_broker) -> None:
    port = limited_broker.tcp
    client_id = unique("mqueue")
    sub = paho_client(client_id, port=port, session_expiry=60)
    sub.subscribe("mq/t", 1)
    sub.disconnect()
    pub = paho_client(port=port)
    for n in range(5):
        pub.publish("mq/t", f"q1-{n}".encode(), 1)
        pub.publish("mq/t", f"q0-{n}".encode(), 0)  # mqueue_store_qos0 = false
    back = paho_client(client_id, port=port, clean_start=False, session_expiry=60)
    assert back.connack.session_present is True
    back.wait_messages(3)
    # max_mqueue_len = 3: the oldest QoS 1 messages were dropped, no QoS 0 was queued.
    assert payloads(back.barrier()) == [b"q1-2", b"q1-3", b"q1-4"]


def test_v5_packet_too_large(paho_client, limited_broker) -> None:
    client = paho_client(port=limited_broker.tcp)
    assert client.connack.prop("MaximumPacketSize") == 2048
    client.subscribe("big/t", 1)
    client.publish("big/t", b"x" * 1900, 1)  # fits
    assert payloads(client.wait_messages(1)) == [b"x" * 1900]
    client.client.publish("big/t", b"x" * 3000, 1)
    assert client.wait_disconnected() == 0x95  # Packet too large


# ---- volume and fan-out ------------------------------------------------------------------------
@pytest.mark.parametrize("qos", [1, 2])
def test_many_messages_through_the_inflight_window(paho_client, shared_broker, topic,
                                                   qos) -> None:
    """Far more messages than the broker's 32-message in-flight window: every one arrives once,
    in order, which needs each acknowledgement to match the packet ID the broker used."""
    subs = [paho_client(version=4), paho_client(version=5)]
    for sub in subs:
        sub.subscribe(f"{topic}/bulk", qos)
    pub = paho_client()
    sent = [f"bulk-{n:04d}".encode() for n in range(300)]
    for payload in sent:
        pub.client.publish(f"{topic}/bulk", payload, qos)  # pipelined, paho limits in-flight
    pub.publish(f"{topic}/end", b"", qos)
    for sub in subs:
        assert payloads(sub.wait_messages(300, timeout=15)) == sent
        assert payloads(sub.barrier()) == sent
        wait_until(lambda s=sub: api_client(shared_broker.ports["http"], s.client_id)[
            "inflight_cnt"] == 0, what="every delivery acknowledged")


def test_fan_out_to_mixed_subscribers(paho_client, topic) -> None:
    """One message, many encodings: versions, QoS, retain-as-published, identifiers."""
    name = f"{topic}/fan"
    subs = {
        "v3q0": (paho_client(version=4), {"qos": 0}),
        "v3q1": (paho_client(version=4), {"qos": 1}),
        "v3q2": (paho_client(version=4), {"qos": 2}),
        "v5q1": (paho_client(), {"qos": 1}),
        "v5q2id": (paho_client(), {"qos": 2, "sub_id": 5}),
        "v5rap": (paho_client(), {"qos": 1, "retain_as_published": True}),
    }
    for client, options in subs.values():
        client.subscribe(name, **options)
    pub = paho_client()
    sent = []
    for n in range(30):
        qos, retain = n % 3, n % 4 == 0
        sent.append((f"fan-{n}".encode(), qos, retain))
        pub.publish(name, f"fan-{n}".encode(), qos, retain=retain)
    for label, (client, options) in subs.items():
        received = client.wait_messages(len(sent))
        client.barrier()
        by_payload = {m.payload: m for m in client.messages if m.topic == name}
        assert sorted(by_payload) == sorted(p for p, _, _ in sent), label
        assert len(client.messages) == len(sent), label
        for payload, qos, retain in sent:
            got = by_payload[payload]
            assert got.qos == min(qos, options["qos"]), (label, payload)
            assert got.retain == (retain and options.get("retain_as_published", False)), label
            expected_ids = [options["sub_id"]] if "sub_id" in options else None
            assert got.prop("SubscriptionIdentifier") == expected_ids, (label, payload)
        # Per QoS the order is the publish order (paho hands QoS 2 over later).
        for qos in range(3):
            ordered = [m.payload for m in received if m.qos == qos]
            assert ordered == sorted(ordered, key=lambda p: int(p.split(b"-")[1])), label


def test_slow_consumer_does_not_stall_others(paho_client, shared_broker, topic) -> None:
    """A subscriber that stops reading: QoS 0 for it is dropped past the broker's buffer
    limit (counted), while a healthy subscriber still receives everything."""
    http = shared_broker.ports["http"]
    stuck, _ = raw_connect(shared_broker.tcp, unique("stuck"), keepalive=0, version=4)
    with stuck:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        raw_subscribe(stuck, 1, [(f"{topic}/flood", 0)])  # ... and never reads again
        healthy = paho_client()
        healthy.subscribe(f"{topic}/flood", 0)
        before = scrape_metrics(http).get('mqtt_messages_dropped_total{reason="slow_consumer"}',
                                          0)
        pub = paho_client()
        chunk = b"z" * 100_000
        count = 200  # 20 MB: well past the 8 MB the broker buffers for one client
        for n in range(count):
            pub.client.publish(f"{topic}/flood", n.to_bytes(4, "big") + chunk, 0)
            if n % 20 == 19:  # in 2 MB steps, so the healthy client never lags 8 MB behind
                healthy.wait_messages(n + 1, timeout=10)
        pub.publish(f"{topic}/flood", b"end", 1)
        received = healthy.wait_messages(count + 1, timeout=10)
        assert [int.from_bytes(m.payload[:4], "big") for m in received[:count]] == list(
            range(count))
        after = scrape_metrics(http)['mqtt_messages_dropped_total{reason="slow_consumer"}']
        assert after > before


def test_wildcard_and_shared_subscriptions_disabled(paho_client, limited_broker) -> None:
    client = paho_client(port=limited_broker.tcp)
    assert client.connack.prop("WildcardSubscriptionAvailable") == 0
    assert client.connack.prop("SharedSubscriptionAvailable") == 0
    codes = client.subscribe([("w/+", 1), ("w/#", 1), ("$share/g/w", 1), ("w/plain", 1)])
    assert codes == [0xA2, 0xA2, 0x9E, 1]
    assert client.connected


@BOTH
def test_client_id_length_limit(paho_client, limited_broker, version) -> None:
    fits = paho_client("x" * 40, port=limited_broker.tcp, version=version)
    assert fits.connack.reason_code == 0
    too_long = paho_client("y" * 41, port=limited_broker.tcp, version=version, connect=False)
    result = too_long.connect(expect_success=False)
    assert result.reason_code == 0x85  # Client Identifier not valid (v3.1.1: return code 2)


def test_topic_level_limit(paho_client, limited_broker) -> None:
    client = paho_client(port=limited_broker.tcp)
    eight, nine = "/".join("l" * 8), "/".join("l" * 9)  # at most 8 levels
    assert client.subscribe([(eight, 1), (nine, 1)]) == [1, 0x8F]
    client.publish(eight, b"ok", 1)
    assert payloads(client.wait_messages(1)) == [b"ok"]
    client.client.publish(nine, b"too deep", 1)
    assert client.wait_disconnected() == 0x90  # Topic Name invalid


def test_v5_no_local_on_shared_subscription_is_protocol_error(paho_client, topic) -> None:
    client = paho_client()
    client.client.subscribe((f"$share/g/{topic}", SubscribeOptions(1, noLocal=True)))
    assert client.wait_disconnected() == 0x82  # MQTT-3.8.3-4
