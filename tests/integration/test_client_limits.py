"""Limits that protect the node from one client, on a live broker with real clients:
`messages_rate` / `bytes_rate` slow a publisher down without losing anything,
`force_shutdown.max_heap_size` closes a client that never reads, and a burst of bad CONNECTs
does not keep a good client out.

Memory is the broker process's resident set (VmRSS). A client that never reads is a raw
socket with a small receive buffer: a library would read for it.
"""

import asyncio
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho_mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes

from broker.mqtt.codec import encode
from broker.mqtt.constants import PropertyId
from broker.mqtt.packets import Connect, Publish, Subscribe, Subscription
from tests.integration.clients import PahoClient, payloads, props, unique, wait_until
from tests.protocol.test_tls import self_signed
from tests.support.broker_process import BrokerProcess
from tests.support.raw_mqtt import PINGREQ, PINGRESP, raw_connect, recv_packet

pytestmark = pytest.mark.integration

MB = 1024 * 1024
COUNT = 200
PAHO_INFLIGHT = 20  # paho's default window: at most this many PUBLISHes in one read


def _client(clients: list[PahoClient], port: int, transport: str = "tcp",
            ca: Path | None = None, **connect: Any) -> PahoClient:
    client = PahoClient(port, unique("lim"), transport=transport)
    if ca is not None:
        client.client.tls_set(ca_certs=str(ca), cert_reqs=ssl.CERT_REQUIRED)
    clients.append(client)
    client.connect(**connect)
    return client


def _publish_all(publisher: PahoClient, topic: str, bodies: list[bytes],
                 timeout: float) -> float:
    """Hands every message to paho at once (it sends as fast as its window allows); returns
    the seconds until the last PUBACK."""
    started = time.monotonic()
    infos = [publisher.client.publish(topic, body, 1) for body in bodies]
    assert all(info.rc == paho_mqtt.MQTT_ERR_SUCCESS for info in infos)
    wait_until(lambda: all(info.is_published() for info in infos), timeout,
               "every PUBACK")
    return time.monotonic() - started


@pytest.mark.parametrize(("listener", "limit"), [
    ("tcp", "messages_rate"), ("ws", "bytes_rate"), ("ssl", "messages_rate"),
])
def test_a_publisher_above_its_rate_is_slowed_and_loses_nothing(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient],
        tmp_path: Path, listener: str, limit: str) -> None:
    body_size = 400
    # 50 messages a second; or 16 KB a second, about 38 of these messages.
    rate = "50/s" if limit == "messages_rate" else "16KB/s"
    settings = {f"listeners.{listener}.default.{limit}": rate}
    ca = None
    if listener == "ssl":
        ca, key = self_signed(tmp_path)
        settings.update({"listeners.ssl.default.bind": "127.0.0.1:0",
                         "listeners.ssl.default.ssl_options.certfile": str(ca),
                         "listeners.ssl.default.ssl_options.keyfile": str(key)})
    broker = start_broker(**settings)
    topic = unique("rate").replace("-", "/")
    subscriber = _client(clients, broker.tcp)  # sends little: never limited
    subscriber.subscribe(topic, 1)
    publisher = _client(clients, broker.ports[listener],
                        "websockets" if listener == "ws" else "tcp", ca)
    bodies = [b"%04d" % n + b"x" * (body_size - 4) for n in range(COUNT)]

    elapsed = _publish_all(publisher, topic, bodies, timeout=60)

    if limit == "messages_rate":
        # The bucket's 50 at once, then 50 a second; the last read's PUBLISHes are handled
        # before the pause they cause.
        least = (COUNT - 50 - PAHO_INFLIGHT) / 50
    else:
        packet = len(encode(Publish(topic, bodies[0], qos=1, packet_id=1), 5))
        least = (COUNT * packet - 16 * 1024 - PAHO_INFLIGHT * packet) / (16 * 1024)
    assert elapsed >= least, f"{COUNT} messages in {elapsed:.2f} s, not slowed to {rate}"
    assert publisher.connected and publisher.disconnect_count == 0
    assert payloads(subscriber.wait_messages(COUNT, timeout=30)) == bodies  # all, in order
    assert broker.metric("mqtt_limit_throttled_total", limit=f"{listener}.{limit}") >= 1


def _never_reading(port: int, topic: str, client_id: str, expiry: int) -> socket.socket:
    """A v5 client with a large Receive Maximum that subscribes to `topic` and then reads
    nothing more (a 4 KB receive buffer: the broker's output piles up on its side)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    properties: dict[int, object] = {PropertyId.RECEIVE_MAXIMUM: 65535}
    if expiry:
        properties[PropertyId.SESSION_EXPIRY_INTERVAL] = expiry
    sock.sendall(encode(Connect(client_id, protocol_level=5, clean_start=not expiry,
                                keepalive=0, properties=properties), 5))
    assert recv_packet(sock)[:1] == b"\x20"
    sock.sendall(encode(Subscribe(1, [Subscription(topic, qos=1)]), 5))
    assert recv_packet(sock)[:1] == b"\x90"
    return sock


def _closed_by_broker(sock: socket.socket) -> bool:
    """Whether the broker ended the connection (a reset: what it had sent is dropped; what
    arrived before is read and discarded)."""
    sock.setblocking(False)
    try:
        while sock.recv(1 << 20):
            pass
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    return True


SLOW = {
    "force_shutdown.max_heap_size": "16MB",
    "mqtt.max_inflight": "65535",  # the never-reading client's window is its own 65535
    "durable_sessions.enable": "false",
}


def test_a_client_that_never_reads_is_closed_past_max_heap_size(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient]) -> None:
    """3000 QoS 1 messages of 64 KB (188 MB) for a client that reads none: without the
    bound all of them wait in the broker for it (which then grows by ~3x that). It is closed
    once 16 MB are unsent, and a client that reads gets every message meanwhile. The broker
    grows by the bound, the reader's share and the allocator's slack (~55 MB here)."""
    broker = start_broker(**SLOW)
    topic = unique("slow").replace("-", "/")
    slow = _never_reading(broker.tcp, topic, unique("slow"), expiry=0)
    reader = _client(clients, broker.tcp)
    reader.subscribe(topic, 1)
    publisher = _client(clients, broker.tcp)
    bodies = [b"%05d" % n + b"x" * (64 * 1024 - 5) for n in range(3000)]
    baseline = peak = broker.rss()
    try:
        # In steps of 50 that the reader has read: it never lags far enough to be closed.
        for step in range(0, len(bodies), 50):
            _publish_all(publisher, topic, bodies[step:step + 50], timeout=30)
            reader.wait_messages(step + 50, timeout=30)
            peak = max(peak, broker.rss())
        assert broker.metric("mqtt_limit_refusals_total", limit="max_heap_size") == 1
        wait_until(lambda: _closed_by_broker(slow), 10, "the slow client closed")
    finally:
        slow.close()
    assert payloads(reader.wait_messages(len(bodies))) == bodies
    growth = peak - baseline
    assert growth < 96 * MB, f"the broker grew by {growth / MB:.0f} MB"
    assert "past force_shutdown.max_heap_size" in broker.log_text()
    with raw_connect(broker.tcp, unique("after"), keepalive=30)[0] as other:
        other.sendall(PINGREQ)
        assert recv_packet(other) == PINGRESP


def test_a_closed_slow_durable_session_keeps_its_messages(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient]) -> None:
    """The same client with a durable session: closed past the bound, and when it comes back
    and reads, every message is there (they were in storage, not only in the lost output)."""
    broker = start_broker(**{**SLOW, "durable_sessions.enable": "true",
                             "force_shutdown.max_heap_size": "4MB"})
    topic = unique("slowd").replace("-", "/")
    client_id = unique("slowd")
    slow = _never_reading(broker.tcp, topic, client_id, expiry=600)
    publisher = _client(clients, broker.tcp)
    bodies = [b"%05d" % n + b"x" * (64 * 1024 - 5) for n in range(400)]
    try:
        _publish_all(publisher, topic, bodies, timeout=120)
        wait_until(lambda: broker.metric("mqtt_limit_refusals_total",
                                         limit="max_heap_size") == 1, 30, "the slow client closed")
        wait_until(lambda: _closed_by_broker(slow), 10, "the slow client closed")
    finally:
        slow.close()
    back = PahoClient(broker.tcp, client_id)
    clients.append(back)
    # A window of 10 (640 KB in flight) reads well within the bound.
    window = props(PacketTypes.CONNECT, ReceiveMaximum=10)
    assert back.connect(clean_start=False, session_expiry=600,
                        properties=window).session_present
    got = back.wait_messages(len(bodies), timeout=60)
    assert sorted(set(payloads(got))) == bodies  # resent ones may come twice (DUP)


def _passwd(path: Path, user: str, password: str) -> None:
    create = [] if path.exists() else ["-c"]
    subprocess.run(["mosquitto_passwd", *create, "-b", str(path), user, password], check=True)


class BadConnectBurst:
    """`parallel` raw sockets, each sending CONNECT with a wrong password, reading the answer
    and starting over, on its own event loop in a thread, until stopped."""

    def __init__(self, port: int, parallel: int) -> None:
        self.port = port
        self.parallel = parallel
        self.answered = 0  # CONNACKs (refusals) read
        self.errors = 0  # connections closed or reset without one
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> "BadConnectBurst":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    async def _run(self) -> None:
        await asyncio.gather(*(self._one(n) for n in range(self.parallel)))

    async def _one(self, n: int) -> None:
        connect = encode(Connect(f"bad-{n}", protocol_level=5, username="alice",
                                 password=b"not-the-password"), 5)
        while not self._stop.is_set():
            writer = None
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(connect)
                head = await asyncio.wait_for(reader.readexactly(2), 30)
                await reader.readexactly(head[1])
                self.answered += 1
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                self.errors += 1
            finally:
                if writer is not None:
                    writer.close()


def test_a_burst_of_bad_connects_does_not_keep_a_good_client_out(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient],
        tmp_path: Path) -> None:
    passwords = tmp_path / "passwd"
    _passwd(passwords, "alice", "wonder:land")
    _passwd(passwords, "bob", "builder")
    broker = start_broker(**{"authentication.password_file": str(passwords)})
    topic = unique("good").replace("-", "/")
    with BadConnectBurst(broker.tcp, parallel=500) as burst:
        wait_until(lambda: burst.answered >= 1000, 60, "the burst under way")
        for attempt in range(3):
            before = burst.answered
            started = time.monotonic()
            good = PahoClient(broker.tcp, unique("good"))
            good.client.username_pw_set("bob", "builder")
            clients.append(good)
            good.connect(timeout=10)
            good.subscribe(topic, 1)
            assert good.publish(topic, b"%d" % attempt, 1, timeout=10) == 0
            assert payloads(good.wait_messages(1, timeout=10)) == [b"%d" % attempt]
            took = time.monotonic() - started
            good.disconnect()
            assert took < 3.0, f"a good client needed {took:.2f} s during the burst"
            # Served while the burst went on (it may take a few ms: then no bad CONNECT
            # need have been answered in between).
            wait_until(lambda n=before: burst.answered > n, 10, "the burst still running")
    refused = broker.metric("mqtt_auth_failures_total", reason="bad_password")
    assert refused >= 1000
    assert broker.proc is not None and broker.proc.poll() is None
