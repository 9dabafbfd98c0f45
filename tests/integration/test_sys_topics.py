"""`$SYS` belongs to the broker: clients cannot write it (MQTT 4.7.2), and the node publishes
its own topics there every `sys_topics.sys_msg_interval`, in EMQX's layout."""

from collections.abc import Callable

import pytest

from broker.mqtt.packets import Publish, Pubrec
from broker.version import RELEASE
from tests.integration.clients import (
    BOTH,
    NO_MATCHING_SUBSCRIBERS,
    PahoClient,
    scrape_metrics,
    wait_until,
)
from tests.protocol.rawclient import RawClient
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

NOT_AUTHORIZED = 0x87
NODE = "broker@127.0.0.1"  # node.name's default
BASE = f"$SYS/brokers/{NODE}/"
FORGED = "$SYS/broker/version"  # Mosquitto's name: the node's own are under $SYS/brokers

Clients = Callable[..., PahoClient]
Brokers = Callable[..., BrokerProcess]


def dropped(broker: BrokerProcess) -> float:
    metrics = scrape_metrics(broker.ports["http"])
    return metrics.get('mqtt_messages_dropped_total{reason="sys_topic_denied"}', 0.0)


def retained_under(paho_client: Clients, broker: BrokerProcess, topic_filter: str) -> list:
    """Every retained message a new subscriber of `topic_filter` gets but the node's own."""
    sub = paho_client(port=broker.tcp)
    sub.subscribe(topic_filter, 1)
    return [m for m in sub.barrier() if not m.topic.startswith("$SYS/brokers")]


def pubrec_reason(broker: BrokerProcess, topic: str) -> int:
    """paho goes on with PUBREL after a refusing PUBREC: read the PUBREC itself."""
    raw = RawClient(broker.tcp)
    try:
        raw.connect("raw-qos2")
        raw.send(Publish(topic, b"evil 2.0", 2, True, packet_id=1))
        pubrec = raw.recv()
        assert isinstance(pubrec, Pubrec) and pubrec.packet_id == 1
        return pubrec.reason_code
    finally:
        raw.close()


def test_a_client_cannot_write_sys(paho_client: Clients, start_broker: Brokers) -> None:
    broker = start_broker()
    v5 = paho_client(port=broker.tcp)
    assert v5.publish(FORGED, b"evil 1.0", 1, retain=True) == NOT_AUTHORIZED
    assert pubrec_reason(broker, FORGED) == NOT_AUTHORIZED
    assert v5.publish("$SYS", b"evil", 1, retain=True) == NOT_AUTHORIZED
    v5.publish(FORGED, b"evil 0", 0, retain=True)
    v3 = paho_client(port=broker.tcp, version=4)
    assert v3.publish(FORGED, b"evil 3.1.1", 1, retain=True) == 0  # no reason codes in v3
    assert v3.publish(FORGED, b"evil 3.1.1", 2, retain=True) == 0
    assert v5.connected and v3.connected
    v5.barrier()  # the QoS 0 PUBLISH was read
    assert retained_under(paho_client, broker, "$SYS/#") == []
    assert dropped(broker) == 6
    # Topics merely starting with the letters are the clients' own.
    assert v5.publish("$SYSTEM/x", b"ok", 1) == NO_MATCHING_SUBSCRIBERS


@BOTH
def test_a_will_cannot_write_sys(paho_client: Clients, start_broker: Brokers,
                                 version: int) -> None:
    """The broker would publish the will for the client: refused at CONNECT."""
    broker = start_broker()
    client = paho_client(port=broker.tcp, version=version, connect=False)
    will = {"topic": FORGED, "payload": b"evil", "qos": 1, "retain": True}
    assert client.connect(will=will, expect_success=False).reason_code == NOT_AUTHORIZED
    assert retained_under(paho_client, broker, "$SYS/#") == []


def test_a_setting_lets_clients_write_sys(paho_client: Clients, start_broker: Brokers) -> None:
    broker = start_broker(**{"sys_topics.allow_client_publish": "true"})
    v5 = paho_client(port=broker.tcp)
    assert v5.publish(FORGED, b"allowed", 1, retain=True) == NO_MATCHING_SUBSCRIBERS
    assert [m.payload for m in retained_under(paho_client, broker, FORGED)] == [b"allowed"]

    # Turned off again, the node removes what clients left retained there.
    assert broker.stop() == 0
    broker = start_broker(broker.data_dir)
    assert retained_under(paho_client, broker, "$SYS/#") == []


def test_the_node_publishes_its_sys_topics(paho_client: Clients, start_broker: Brokers) -> None:
    broker = start_broker(**{"sys_topics.sys_msg_interval": "1s"})
    sub = paho_client(port=broker.tcp)
    sub.subscribe("$SYS/#", 0)
    version = sub.wait_message_on(BASE + "version")
    assert version.payload == RELEASE.encode()
    assert sub.wait_message_on("$SYS/brokers").payload == NODE.encode()
    connections = sub.wait_message_on(BASE + "stats/connections/count")
    assert int(connections.payload) >= 1
    first = sub.wait_message_on(BASE + "uptime")

    def uptimes() -> list[int]:
        return [int(m.payload) for m in sub.messages if m.topic == BASE + "uptime"]

    wait_until(lambda: len(uptimes()) >= 2, what="a second uptime")
    assert uptimes()[1] > int(first.payload) >= 0  # milliseconds since start, every second
    late = paho_client(port=broker.tcp)
    late.subscribe("$SYS/#", 0)
    assert {m.topic for m in late.barrier()} == {"$SYS/brokers", BASE + "version",
                                                  BASE + "sysdescr"}


def test_an_interval_of_0_publishes_nothing(paho_client: Clients,
                                            start_broker: Brokers) -> None:
    broker = start_broker(**{"sys_topics.sys_msg_interval": "0"})
    sub = paho_client(port=broker.tcp)
    sub.subscribe("$SYS/#", 0)
    assert sub.barrier() == []
