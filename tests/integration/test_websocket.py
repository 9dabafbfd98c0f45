"""MQTT over WebSocket (paho transport="websockets", subprotocol "mqtt") on the ws listener."""

import socket

import h11
import pytest
from paho.mqtt.client import WebsocketConnectionError
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection
from wsproto.events import Request as WsRequest

from tests.integration.clients import BOTH, PahoClient, unique
from tests.support.raw_mqtt import raw_connect_packet

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


def _upgrade(port: int, *protocols: str) -> tuple[socket.socket, h11.Response]:
    """A WebSocket upgrade request offering `protocols` (none: no Sec-WebSocket-Protocol);
    returns the socket and the broker's answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    headers = [("Host", "127.0.0.1"), ("Upgrade", "websocket"), ("Connection", "Upgrade"),
               ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Sec-WebSocket-Version", "13")]
    if protocols:
        headers.append(("Sec-WebSocket-Protocol", ", ".join(protocols)))
    http = h11.Connection(h11.CLIENT)
    sock.sendall(http.send(h11.Request(method="GET", target="/mqtt", headers=headers)))
    while True:
        event = http.next_event()
        if event is h11.NEED_DATA:
            http.receive_data(sock.recv(4096))
        elif isinstance(event, h11.Response | h11.InformationalResponse):
            return sock, event  # type: ignore[return-value]


@pytest.mark.parametrize("offered", [(), ("chat",), ("v12.stomp", "wamp")],
                         ids=["none", "foreign", "two-foreign"])
def test_websocket_without_mqtt_subprotocol_refused(shared_broker, offered) -> None:
    """MQTT over WebSocket requires the `mqtt` subprotocol (MQTT 5.0 section 6.0): an
    upgrade offering none we support is refused (EMQX's fail_if_no_subprotocol, the
    default), not accepted without a protocol header."""
    sock, answer = _upgrade(shared_broker.ports["ws"], *offered)
    sock.close()
    assert answer.status_code == 400


@pytest.mark.parametrize(("offered", "chosen"), [(("mqtt",), b"mqtt"),
                                                 (("chat", "mqttv3.1"), b"mqttv3.1")])
def test_websocket_answers_the_mqtt_subprotocol_offered(shared_broker, offered, chosen) -> None:
    sock, answer = _upgrade(shared_broker.ports["ws"], *offered)
    sock.close()
    assert answer.status_code == 101
    assert dict(answer.headers)[b"sec-websocket-protocol"] == chosen


def test_oversized_websocket_message_closed_with_1009(shared_broker) -> None:
    """A frame carrying a PUBLISH larger than mqtt.max_packet_size (1 MB) ends with close
    code 1009, message too big (RFC 6455 section 7.4.1), not 1000, normal closure."""
    port = shared_broker.ports["ws"]
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    ws = WSConnection(ConnectionType.CLIENT)
    sock.sendall(ws.send(WsRequest(host="127.0.0.1", target="/mqtt", subprotocols=["mqtt"])))
    connect = raw_connect_packet(unique("wsbig"), keepalive=30)
    too_big = b"\x30\x80\x80\x80\x01" + b"\x00\x01t" + b"x" * 1000  # declares 2 MB
    events: list[object] = []
    with sock:
        while not any(isinstance(e, CloseConnection) for e in events):
            data = sock.recv(65536)
            if not data:
                break
            ws.receive_data(data)
            for event in ws.events():
                events.append(event)
                if isinstance(event, AcceptConnection):
                    sock.sendall(ws.send(BytesMessage(data=connect)))
                elif isinstance(event, BytesMessage) and event.data[:1] == b"\x20":  # CONNACK
                    sock.sendall(ws.send(BytesMessage(data=too_big)))
    closes = [e for e in events if isinstance(e, CloseConnection)]
    assert [c.code for c in closes] == [1009], events
