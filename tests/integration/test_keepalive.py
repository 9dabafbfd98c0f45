"""Keep alive (MQTT-3.1.2-22): a client silent for 1.5 x its keepalive is disconnected.

Raw sockets, because a real client library always sends PINGREQ on time; the point here is a
client that does not. Waiting is on socket readiness (select), not on a sleep.
"""

import select
import socket
import time

import pytest

from tests.integration.clients import KEEP_ALIVE_TIMEOUT, unique
from tests.support.raw_mqtt import PINGREQ, PINGRESP, raw_connect, read_until_closed, recv_packet

pytestmark = pytest.mark.integration

def test_silent_clients_disconnected_after_one_and_a_half_keepalives(
    shared_broker, paho_client, topic
) -> None:
    """Both protocol versions at once; a pinging client on the same settings survives, and
    the silent clients' wills are published when they are cut off."""
    watcher = paho_client()
    watcher.subscribe(f"{topic}/will/#", 1)
    started = time.monotonic()
    silent3, _ = raw_connect(shared_broker.tcp, unique("silent3"), keepalive=1, version=4,
                             will=(f"{topic}/will/3", b"timed out 3", 1))
    silent5, connack5 = raw_connect(shared_broker.tcp, unique("silent5"), keepalive=1,
                                    version=5, will=(f"{topic}/will/5", b"timed out 5", 1))
    pinger, _ = raw_connect(shared_broker.tcp, unique("pinger"), keepalive=1, version=4)
    assert connack5[3] == 0  # CONNACK reason: success
    closed: dict[str, float] = {}
    received: dict[str, bytes] = {"silent3": b"", "silent5": b""}
    sockets = {"silent3": silent3, "silent5": silent5}
    try:
        while len(closed) < 2:
            assert time.monotonic() - started < 4, f"still connected: {received}"
            pinger.sendall(PINGREQ)  # the well-behaved client keeps talking ...
            assert recv_packet(pinger) == PINGRESP
            # ... while we wait (at most half a keepalive) for the silent ones to be dropped.
            open_socks = [s for name, s in sockets.items() if name not in closed]
            readable, _, _ = select.select(open_socks, [], [], 0.5)
            for name, sock in sockets.items():
                if sock in readable and name not in closed:
                    received[name] += read_until_closed(sock, timeout=2)
                    closed[name] = time.monotonic() - started
        for name, elapsed in closed.items():
            # 1 s keepalive x 1.5 (mqtt.keepalive_multiplier), plus scheduling slack.
            assert 1.4 <= elapsed <= 2.5, f"{name} dropped after {elapsed:.2f}s"
        assert received["silent3"] == b""  # v3.1.1: just closed
        # v5: DISCONNECT with reason Keep Alive timeout (0x8D) before the close.
        assert received["silent5"][:1] == b"\xe0"
        assert received["silent5"][2] == KEEP_ALIVE_TIMEOUT
        # The client that sent PINGREQ in time is still served.
        pinger.sendall(PINGREQ)
        assert recv_packet(pinger) == PINGRESP
        wills = {m.topic: m.payload for m in watcher.wait_messages(2)}
        assert wills == {f"{topic}/will/3": b"timed out 3", f"{topic}/will/5": b"timed out 5"}
    finally:
        for sock in (silent3, silent5, pinger):
            sock.close()


def test_server_keepalive_overrides_client_value(start_broker) -> None:
    broker = start_broker(**{"mqtt.server_keepalive": "1s"})
    started = time.monotonic()
    sock, connack = raw_connect(broker.tcp, unique("srvka"), keepalive=600, version=5)
    with sock:
        # CONNACK properties carry Server Keep Alive (0x13) = 1.
        assert b"\x13\x00\x01" in connack
        data = read_until_closed(sock, timeout=4)
        elapsed = time.monotonic() - started
    assert 1.4 <= elapsed <= 2.5, f"dropped after {elapsed:.2f}s"
    assert data[:1] == b"\xe0" and data[2] == KEEP_ALIVE_TIMEOUT


def test_connection_without_connect_closed_after_idle_timeout(start_broker) -> None:
    broker = start_broker(**{"mqtt.idle_timeout": "500ms"})
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", broker.tcp), timeout=5) as sock:
        assert read_until_closed(sock, timeout=3) == b""
    assert 0.4 <= time.monotonic() - started <= 2.0
