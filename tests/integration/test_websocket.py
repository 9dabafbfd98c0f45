"""MQTT over WebSocket (paho transport="websockets", subprotocol "mqtt") on the ws listener."""

import pytest
from paho.mqtt.client import WebsocketConnectionError

from tests.integration.clients import BOTH, PahoClient, unique

pytestmark = pytest.mark.integration


@BOTH
def test_websocket_pub_sub(paho_client, shared_broker, topic, version) -> None:
    ws = shared_broker.ports["ws"]
    sub = paho_client(port=ws, transport="websockets", version=version)
    pub = paho_client(port=ws, transport="websockets", version=version)
    assert sub.connack.reason_code == 0
    sub.subscribe(f"{topic}/ws", 2)
    # A payload bigger than one WebSocket frame buffer, and one packet per tiny message.
    sent = [b"small", b"", bytes(range(256)) * 400, "✓".encode()]
    for qos, payload in enumerate(sent):
        pub.publish(f"{topic}/ws", payload, qos % 3)
    received = sub.wait_messages(len(sent))
    assert sorted(m.payload for m in received) == sorted(sent)  # QoS 2 lands on PUBREL
    assert {m.payload: m.qos for m in received} == {p: q % 3 for q, p in enumerate(sent)}


def test_websocket_and_tcp_clients_share_topics(paho_client, shared_broker, topic) -> None:
    ws_client = paho_client(port=shared_broker.ports["ws"], transport="websockets")
    tcp_client = paho_client()
    ws_client.subscribe(f"{topic}/to-ws", 1)
    tcp_client.subscribe(f"{topic}/to-tcp", 1)
    tcp_client.publish(f"{topic}/to-ws", b"tcp -> ws", 1)
    ws_client.publish(f"{topic}/to-tcp", b"ws -> tcp", 1)
    assert [m.payload for m in ws_client.wait_messages(1)] == [b"tcp -> ws"]
    assert [m.payload for m in tcp_client.wait_messages(1)] == [b"ws -> tcp"]


def test_websocket_retained_and_will(paho_client, shared_broker, topic) -> None:
    ws = shared_broker.ports["ws"]
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will", 1)
    doomed = paho_client(port=ws, transport="websockets",
                         will={"topic": f"{topic}/will", "payload": b"ws died", "qos": 1})
    doomed.publish(f"{topic}/state", b"retained over ws", 1, retain=True)
    doomed.kill()
    assert [m.payload for m in watcher.wait_messages(1)] == [b"ws died"]
    late = paho_client(port=ws, transport="websockets")
    late.subscribe(f"{topic}/state", 1)
    assert [(m.payload, m.retain) for m in late.barrier()] == [(b"retained over ws", True)]


def test_websocket_wrong_path_rejected(shared_broker) -> None:
    client = PahoClient(shared_broker.ports["ws"], unique("wspath"), transport="websockets",
                        ws_path="/not-mqtt")
    with pytest.raises(WebsocketConnectionError):
        client.connect()
    client.close()


def test_websocket_custom_path(paho_client, start_broker) -> None:
    broker = start_broker(**{"listeners.ws.default.websocket.mqtt_path": "/custom/path"})
    wrong = PahoClient(broker.ports["ws"], unique("wspath"), transport="websockets")
    with pytest.raises(WebsocketConnectionError):
        wrong.connect()
    wrong.close()
    client = PahoClient(broker.ports["ws"], unique("wspath"), transport="websockets",
                        ws_path="/custom/path")
    try:
        assert client.connect().reason_code == 0
        client.subscribe("custom/t", 1)
        client.publish("custom/t", b"ok", 1)
        assert [m.payload for m in client.wait_messages(1)] == [b"ok"]
    finally:
        client.close()
