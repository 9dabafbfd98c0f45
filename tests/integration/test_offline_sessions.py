"""Offline durable sessions cost disk, not memory: a session whose client left goes out of
memory (`mqtt_durable_sessions_offloaded`) and comes back whole when its client does, and
its will and expiry still come on time while it is out; a restart leaves them all on disk.

Real brokers, real paho clients; the offloaded gauge shows each session left memory before
the test goes on, so each of these runs the path a session loaded from disk takes.
"""

import time

import pytest
from paho.mqtt.packettypes import PacketTypes

from broker.mqtt.packets import Disconnect, Suback, Subscribe, Subscription
from tests.integration.clients import (
    api_client,
    http_json,
    props,
    scrape_metrics,
    wait_until,
)
from tests.integration.test_durable_sessions import (
    EXPIRY,
    publish_all,
    restart,
    wait_state_on_disk,
)
from tests.protocol.rawclient import RawClient
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration


def offloaded(broker: BrokerProcess) -> float:
    return scrape_metrics(broker.ports["http"])["mqtt_durable_sessions_offloaded"]


def wait_offloaded(broker: BrokerProcess, count: int) -> None:
    wait_until(lambda: offloaded(broker) == count, what=f"{count} sessions out of memory")


def test_an_offloaded_session_resumes_whole(paho_client, start_broker) -> None:
    """Session Present 1, every subscription (a shared one too) and the queue."""
    broker = start_broker()
    sub = paho_client("away", port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    assert sub.subscribe([("away/plain", 1), ("$share/g/away/shared", 1)]) == [1, 1]
    sub.disconnect()
    wait_offloaded(broker, 1)
    pub = paho_client(port=broker.tcp)
    sent = [f"m{n}".encode() for n in range(100)]
    publish_all(pub, "away/plain", sent, 1)
    publish_all(pub, "away/shared", [b"to the group"], 1)

    back = paho_client("away", port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    assert back.connack.session_present is True
    received = back.wait_messages(101, timeout=60)
    assert [m.payload for m in received if m.topic == "away/plain"] == sent
    assert [m.payload for m in received if m.topic == "away/shared"] == [b"to the group"]
    assert len(back.barrier()) == 101
    subscriptions = http_json(broker.ports["http"], "/api/v5/clients/away/subscriptions")
    assert sorted(s["topic"] for s in subscriptions if "away/" in s["topic"]) == [
        "$share/g/away/shared", "away/plain"]
    assert offloaded(broker) == 0  # in memory while its client is here


def test_unacknowledged_deliveries_come_again_after_the_session_was_offloaded(
    paho_client, start_broker
) -> None:
    broker = start_broker(**{"mqtt.max_inflight": "20"})
    sub = paho_client("unacked", port=broker.tcp, clean_start=False, session_expiry=EXPIRY,
                      manual_ack=True)
    sub.subscribe("unacked/t", 1)
    pub = paho_client(port=broker.tcp)
    sent = [f"m{n:03d}".encode() for n in range(60)]
    publish_all(pub, "unacked/t", sent, 1)
    sub.wait_messages(20)  # the window, none acknowledged
    sub.disconnect()
    wait_offloaded(broker, 1)

    back = paho_client("unacked", port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    assert back.connack.session_present is True
    received = back.wait_messages(60)
    assert [m.payload for m in received] == sent
    assert all(m.dup for m in received[:20])


def test_an_offloaded_session_expires_on_time(paho_client, start_broker) -> None:
    broker = start_broker()
    sub = paho_client("brief", port=broker.tcp, clean_start=False, session_expiry=2)
    sub.subscribe("brief/t", 1)
    sub.disconnect()
    left = time.time()
    wait_offloaded(broker, 1)
    wait_until(lambda: scrape_metrics(broker.ports["http"])["mqtt_sessions"] == 0,
               timeout=10, what="the session to expire")
    assert time.time() - left >= 2  # not before its expiry
    assert offloaded(broker) == 0
    assert scrape_metrics(broker.ports["http"])["mqtt_durable_filters"] == 0
    back = paho_client("brief", port=broker.tcp, clean_start=False, session_expiry=60)
    assert back.connack.session_present is False


def test_the_delayed_will_of_an_offloaded_session_fires_once(paho_client, start_broker) -> None:
    broker = start_broker()
    watcher = paho_client(port=broker.tcp)
    watcher.subscribe("wills/#", 1)
    doomed = paho_client("doomed", port=broker.tcp, clean_start=False, session_expiry=EXPIRY,
                         will={"topic": "wills/doomed", "payload": b"gone", "qos": 1,
                               "properties": props(PacketTypes.WILLMESSAGE,
                                                   WillDelayInterval=2)})
    doomed.kill()  # no DISCONNECT: the will is owed 2 s from now
    lost = time.time()
    wait_offloaded(broker, 1)
    (will,) = watcher.wait_messages(1, timeout=10)
    assert time.time() - lost >= 2
    assert (will.topic, will.payload) == ("wills/doomed", b"gone")
    wait_offloaded(broker, 1)  # the session stays, out of memory again
    wait_state_on_disk(broker)
    broker = restart(broker, start_broker, "graceful")
    watcher = paho_client(port=broker.tcp)
    watcher.subscribe("wills/#", 1)
    wait_offloaded(broker, 1)
    assert watcher.barrier() == []  # the will is not published a second time
    assert api_client(broker.ports["http"], "doomed")["connected"] is False


def test_a_restart_leaves_many_sessions_on_disk(paho_client, start_broker) -> None:
    """Every session indexed at once (its messages stored while it is out), none loaded
    until its client comes back."""
    sessions = 300
    broker = start_broker()
    for n in range(sessions):  # MQTT 3.1.1, clean session 0
        client = RawClient(broker.tcp, version=4)
        try:
            assert client.connect(f"many-{n}", clean_start=False).reason_code == 0
            client.send(Subscribe(1, [Subscription(f"many/{n}", qos=1)]))
            assert isinstance(client.recv(), Suback)
            client.send(Disconnect())
            assert client.closed_by_broker()
        finally:
            client.close()
    wait_offloaded(broker, sessions)
    wait_state_on_disk(broker)
    broker = restart(broker, start_broker, "kill")
    assert scrape_metrics(broker.ports["http"])["mqtt_durable_filters"] == sessions
    pub = paho_client(port=broker.tcp)
    for n in range(0, sessions, 50):
        publish_all(pub, f"many/{n}", [f"for {n}".encode()], 1)
    wait_offloaded(broker, sessions)
    for n in range(0, sessions, 50):
        back = paho_client(f"many-{n}", port=broker.tcp, clean_start=False,
                           session_expiry=EXPIRY)
        assert back.connack.session_present is True
        (message,) = back.wait_messages(1)
        assert message.payload == f"for {n}".encode()
    assert offloaded(broker) == sessions - sessions // 50
