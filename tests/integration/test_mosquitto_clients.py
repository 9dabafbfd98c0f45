"""Interoperability with Eclipse Mosquitto's command-line clients (libmosquitto), v3.1.1 and v5.

mosquitto_sub runs with -d so its SUBACK is visible: a test publishes only once the
subscription is in place. Absence is shown by subscribing to the topic under test *and* to a
marker topic in one SUBSCRIBE: the broker sends retained messages in filter order, so the
marker arriving first means the topic had nothing retained.
"""

import pytest

from tests.integration.clients import (
    api_client,
    mosquitto_pub,
    publish_props,
    unique,
    wait_offline,
    wait_until,
)

pytestmark = pytest.mark.integration

VERSIONS = pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])


@pytest.mark.parametrize("version", ["mqttv31", "mqttv311", "mqttv5"])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_pub_sub(shared_broker, mosquitto_sub, topic, version, qos) -> None:
    sub = mosquitto_sub(shared_broker.tcp, [f"{topic}/#"], version=version, qos=qos,
                        extra=["-C", "4"])
    sent = [("a", "first"), ("a/b", "second message"), ("c", "ünïcødé"), ("a", "last")]
    for suffix, text in sent:
        mosquitto_pub(shared_broker.tcp, f"{topic}/{suffix}", text, version=version, qos=qos)
    assert sub.wait_exit() == 0
    got = [(m.topic, m.payload, m.qos, m.retain) for m in sub.messages]
    assert got == [(f"{topic}/{suffix}", text, qos, False) for suffix, text in sent]


@VERSIONS
def test_retained_set_replace_delete(shared_broker, mosquitto_sub, topic, version) -> None:
    port = shared_broker.tcp
    mosquitto_pub(port, f"{topic}/marker", "marker", version=version, qos=1, retain=True)
    mosquitto_pub(port, f"{topic}/r", "v1", version=version, qos=1, retain=True)
    mosquitto_pub(port, f"{topic}/r", "v2", version=version, qos=1, retain=True)
    first = mosquitto_sub(port, [f"{topic}/r", f"{topic}/marker"], version=version, qos=1,
                          extra=["-C", "2"])
    assert first.wait_exit() == 0
    assert [(m.topic, m.payload, m.retain) for m in first.messages] == [
        (f"{topic}/r", "v2", True), (f"{topic}/marker", "marker", True)]

    mosquitto_pub(port, f"{topic}/r", None, version=version, qos=1, retain=True)  # -n -r
    second = mosquitto_sub(port, [f"{topic}/r", f"{topic}/marker"], version=version, qos=1,
                           extra=["-C", "1"])
    assert second.wait_exit() == 0
    assert [m.topic for m in second.messages] == [f"{topic}/marker"]


@VERSIONS
def test_persistent_session_queues_while_offline(shared_broker, mosquitto_sub, topic,
                                                 version) -> None:
    port = shared_broker.tcp
    client_id = unique("mosq")
    session = ["-c", "-i", client_id] + (["-x", "60"] if version == "mqttv5" else [])
    # -E: subscribe, then disconnect normally, leaving the session (and subscription) behind.
    subscribe_only = mosquitto_sub(port, [f"{topic}/q"], version=version, qos=1,
                                   extra=[*session, "-E"])
    assert subscribe_only.wait_exit() == 0
    wait_offline(shared_broker.ports["http"], client_id)
    # One publisher ID: MQTT orders messages per publisher, and so does Durable Storage
    # (a publisher's messages share a shard); three anonymous publishers would not be ordered.
    for n in range(3):
        mosquitto_pub(port, f"{topic}/q", f"queued {n}", version=version, qos=1,
                      extra=["-i", f"{client_id}-pub"])
    # The queued messages may come before the SUBACK of the renewed subscription.
    back = mosquitto_sub(port, [f"{topic}/q"], version=version, qos=1,
                         extra=[*session, "-C", "3"], wait_for_suback=False)
    assert back.wait_exit() == 0
    assert [m.payload for m in back.messages] == ["queued 0", "queued 1", "queued 2"]


@VERSIONS
def test_will_published_when_client_process_killed(shared_broker, mosquitto_sub, paho_client,
                                                    topic, version) -> None:
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will", 1)
    doomed = mosquitto_sub(shared_broker.tcp, [f"{topic}/ignored"], version=version, extra=[
        "--will-topic", f"{topic}/will", "--will-payload", "mosquitto died",
        "--will-qos", "1"])
    doomed.kill()  # SIGKILL: no DISCONNECT, the kernel closes the socket
    (message,) = watcher.wait_messages(1)
    assert (message.topic, message.payload, message.qos) == (f"{topic}/will", b"mosquitto died",
                                                              1)


@VERSIONS
def test_no_will_when_client_exits_normally(shared_broker, mosquitto_sub, paho_client, topic,
                                            version) -> None:
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will", 1)
    client_id = unique("polite")
    polite = mosquitto_sub(shared_broker.tcp, [f"{topic}/x"], version=version, extra=[
        "-i", client_id, "--will-topic", f"{topic}/will", "--will-payload", "unexpected",
        "-C", "1"])
    mosquitto_pub(shared_broker.tcp, f"{topic}/x", "bye", version=version, qos=1)
    assert polite.wait_exit() == 0  # got its one message, sent DISCONNECT, exited
    wait_until(lambda: api_client(shared_broker.ports["http"], client_id) is None,
               what="the broker to end the session")
    assert watcher.barrier() == []


def test_v5_properties_mosquitto_to_paho(shared_broker, paho_client, topic) -> None:
    sub = paho_client()
    sub.subscribe(f"{topic}/props", 1)
    mosquitto_pub(shared_broker.tcp, f"{topic}/props", "with properties", version="mqttv5",
                  qos=1, extra=[
                      "-D", "publish", "user-property", "k", "v1",
                      "-D", "publish", "user-property", "k", "v2",
                      "-D", "publish", "content-type", "text/plain",
                      "-D", "publish", "response-topic", f"{topic}/reply",
                      "-D", "publish", "correlation-data", "corr-1",
                      "-D", "publish", "message-expiry-interval", "120"])
    (message,) = sub.wait_messages(1)
    assert message.payload == b"with properties"
    assert message.prop("UserProperty") == [("k", "v1"), ("k", "v2")]
    assert message.prop("ContentType") == "text/plain"
    assert message.prop("ResponseTopic") == f"{topic}/reply"
    assert message.prop("CorrelationData") == b"corr-1"
    assert 115 <= message.prop("MessageExpiryInterval") <= 120


def test_v5_user_properties_paho_to_mosquitto(shared_broker, mosquitto_sub, paho_client,
                                               topic) -> None:
    sub = mosquitto_sub(shared_broker.tcp, [f"{topic}/up"], version="mqttv5", qos=1,
                        extra=["-C", "1"])
    paho_client().publish(f"{topic}/up", b"hello", 1, properties=publish_props(
        UserProperty=[("b", "2"), ("a", "1"), ("b", "3")]))
    assert sub.wait_exit() == 0
    (message,) = sub.messages
    assert (message.payload, message.qos) == ("hello", 1)
    assert message.user_properties == "b:2 a:1 b:3"


def test_v311_and_v5_clients_interoperate(shared_broker, mosquitto_sub, topic) -> None:
    to_v5 = mosquitto_sub(shared_broker.tcp, [f"{topic}/x"], version="mqttv5", qos=2,
                          extra=["-C", "1"])
    to_v3 = mosquitto_sub(shared_broker.tcp, [f"{topic}/x"], version="mqttv311", qos=2,
                          extra=["-C", "1"])
    mosquitto_pub(shared_broker.tcp, f"{topic}/x", "across versions", version="mqttv311",
                  qos=2)
    assert to_v5.wait_exit() == 0 and to_v3.wait_exit() == 0
    assert [(m.payload, m.qos) for m in to_v5.messages] == [("across versions", 2)]
    assert [(m.payload, m.qos) for m in to_v3.messages] == [("across versions", 2)]
