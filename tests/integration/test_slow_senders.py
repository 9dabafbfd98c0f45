"""Slow and partial senders: a packet begun must arrive within `mqtt.packet_arrival_timeout`,
only whole packets count as keep-alive activity, and the WebSocket and HTTP listeners close
connections whose upgrade or request headers do not arrive within their timeouts.

Raw sockets, because every client library sends whole packets and requests at once; the
point here is one that does not. Waits are on socket readiness (select), not on sleeps.
"""

import select
import socket
import struct
import time

import h11
import pytest

from tests.integration.clients import KEEP_ALIVE_TIMEOUT, scrape_metrics, unique
from tests.support.raw_mqtt import HOST, raw_connect, read_until_closed

pytestmark = pytest.mark.integration

IMPLEMENTATION_SPECIFIC_ERROR = 0x83


def publish_start(declared: int) -> bytes:
    """The first bytes of a QoS 0 PUBLISH announcing a `declared`-byte remaining length."""
    length, encoded = declared, bytearray()
    while True:
        byte, length = length % 128, length // 128
        encoded.append(byte | (0x80 if length else 0))
        if not length:
            break
    return b"\x30" + bytes(encoded) + struct.pack(">H", 1) + b"t" + b"x" * 1000


def timed_out(http_port: int, stage: str) -> float:
    return scrape_metrics(http_port).get(f'mqtt_connections_timed_out_total{{stage="{stage}"}}', 0)


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_unfinished_packet_closed_after_packet_arrival_timeout(start_broker, version) -> None:
    """Keep-alive 0 and a ~900 KB PUBLISH that never completes: without the bound the
    connection and its buffer were held for as long as the client liked."""
    broker = start_broker(**{"mqtt.packet_arrival_timeout": "1s"})
    sock, _ = raw_connect(broker.tcp, unique("stalled"), keepalive=0, version=version)
    with sock:
        sock.sendall(publish_start(900_000))
        started = time.monotonic()
        data = read_until_closed(sock, timeout=5)
        elapsed = time.monotonic() - started
    assert 0.9 <= elapsed <= 3, f"closed after {elapsed:.2f}s"
    if version == 5:
        assert data[:1] == b"\xe0" and data[2] == IMPLEMENTATION_SPECIFIC_ERROR  # DISCONNECT
    else:
        assert data == b""
    assert timed_out(broker.ports["http"], "packet_arrival") == 1


def test_dribbled_bytes_do_not_keep_a_connection_alive(start_broker) -> None:
    """Keep-alive 2 s: a client sending one byte of a packet every half second is not
    active, so it is cut off at 1.5 x 2 s like a silent one (MQTT-3.1.2-22 counts Control
    Packets). The packet arrival bound (30 s by default) is not what closes it."""
    broker = start_broker()
    sock, _ = raw_connect(broker.tcp, unique("dribbler"), keepalive=2, version=5)
    dribble = publish_start(900_000)
    started = time.monotonic()
    with sock:
        for byte in dribble:
            assert time.monotonic() - started < 6, "still open while dribbling"
            readable, _, _ = select.select([sock], [], [], 0.5)
            if readable:
                break
            sock.sendall(bytes([byte]))
        data = read_until_closed(sock, timeout=2)
    elapsed = time.monotonic() - started
    assert 2.5 <= elapsed <= 4.5, f"closed after {elapsed:.2f}s"
    assert data[:1] == b"\xe0" and data[2] == KEEP_ALIVE_TIMEOUT  # DISCONNECT


@pytest.mark.parametrize("listener", ["ws", "http"])
def test_silent_and_partial_handshakes_closed_after_their_timeout(start_broker, listener) -> None:
    """A connection that sends nothing and one that sends half its request headers, to the
    WebSocket listener (upgrade) and to the HTTP API: both closed after 1 s, counted.
    They were held 40 s and more (the HTTP API's keep-alive timeout; WebSocket: forever)."""
    broker = start_broker(**{"listeners.ws.default.websocket.handshake_timeout": "1s",
                             "dashboard.listeners.http.header_timeout": "1s"})
    port = broker.ports[listener]
    path = "/mqtt" if listener == "ws" else "/metrics"
    started = time.monotonic()
    with socket.create_connection((HOST, port)) as silent, \
            socket.create_connection((HOST, port)) as partial:
        partial.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\n".encode())
        assert read_until_closed(silent, timeout=4) == b""
        assert read_until_closed(partial, timeout=4) == b""
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed <= 3, f"closed after {elapsed:.2f}s"
    stage = "ws_handshake" if listener == "ws" else "http_headers"
    assert timed_out(broker.ports["http"], stage) == 2  # (and /metrics itself still works)


def test_kept_alive_http_connection_closed_when_its_next_request_stalls(start_broker) -> None:
    """After one whole request and response, half the headers of a second one: closed after
    the same bound (it was aiohttp's keep-alive default, an hour)."""
    broker = start_broker(**{"dashboard.listeners.http.header_timeout": "1s"})
    request = f"GET /metrics HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
    with socket.create_connection((HOST, broker.ports["http"]), timeout=5) as sock:
        sock.sendall(request)
        http = h11.Connection(h11.CLIENT)
        while not isinstance(event := http.next_event(), h11.EndOfMessage):
            if event is h11.NEED_DATA:
                http.receive_data(sock.recv(65536))
        sock.sendall(request[:20])
        started = time.monotonic()
        assert read_until_closed(sock, timeout=4) == b""
    elapsed = time.monotonic() - started
    assert elapsed <= 3, f"closed after {elapsed:.2f}s"
