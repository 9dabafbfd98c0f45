"""paho-mqtt (MQTT 3.1.1 and 5.0) against the real broker process over TCP: connecting, QoS,
topic filters, retained messages, shared subscriptions, volume.

Absence of a delivery is proven with `barrier()` (SUBSCRIBE round trips on the receiving
connection) after the publisher's own acknowledgement, never by waiting for a while.
"""

import socket

import pytest

from tests.integration.clients import (
    BOTH,
    NO_MATCHING_SUBSCRIBERS,
    NO_SUBSCRIPTION_EXISTED,
    PAYLOAD_FORMAT_INVALID,
    SUCCESS,
    TOPIC_FILTER_INVALID,
    api_client,
    payloads,
    publish_props,
    scrape_metrics,
    unique,
    wait_offline,
    wait_until,
)
from tests.support.broker_process import BrokerProcess
from tests.support.raw_mqtt import PINGREQ, PINGRESP, raw_connect, raw_subscribe, recv_packet

pytestmark = pytest.mark.integration


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


def test_dollar_topics_not_matched_by_leading_wildcards(paho_client, start_broker) -> None:
    # A broker of its own: a root '#' here must not see other tests' traffic; clients may
    # write $SYS there, and the node publishes nothing of its own to it.
    broker = start_broker(**{"sys_topics.allow_client_publish": "true",
                             "sys_topics.sys_msg_interval": "0"})
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
        bad = TOPIC_FILTER_INVALID if version == 5 else 0x80
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


def test_a_group_of_a_memory_member_and_a_durable_one_is_two_parts(
        paho_client, shared_broker, topic) -> None:
    """A memory session's `$share` subscription is routed live; a durable session's makes it
    a member of the durable group of that name and filter: the group is two parts, each
    given every message (docs/architecture.md, "Memory members"), not one in which an online
    member takes what an offline one would have had. The online memory member gets the
    messages at once, the durable one finds them stored when it is back."""
    online = paho_client()
    online.subscribe(f"$share/g/{topic}/w", 1)
    offline_id = unique("member")
    offline = paho_client(offline_id, session_expiry=60)
    offline.subscribe(f"$share/g/{topic}/w", 1)
    offline.disconnect()  # keeps its session and its membership
    wait_offline(shared_broker.ports["http"], offline_id)
    pub = paho_client()
    for n in range(6):
        pub.publish(f"{topic}/w", f"w{n}".encode(), 1)
    assert payloads(online.wait_messages(6)) == [f"w{n}".encode() for n in range(6)]
    back = paho_client(offline_id, clean_start=False, session_expiry=60)
    assert back.connack.session_present is True
    assert sorted(payloads(back.wait_messages(6))) == [f"w{n}".encode() for n in range(6)]


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
