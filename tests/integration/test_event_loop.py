"""node.event_loop: the broker runs on uvloop when asked, for TCP and WebSocket clients
alike, and refuses it where cluster links would need asyncio's transports."""

import subprocess
import sys
from pathlib import Path

from tests.integration.clients import unique


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_uvloop_serves_tcp_and_websocket_clients(paho_client, start_broker) -> None:
    broker = start_broker(**{"node.event_loop": "uvloop"})
    assert broker.proc is not None
    assert "uvloop/loop." in _mapped(broker.proc.pid)
    topic = unique("uvloop")
    listener = paho_client(port=broker.tcp)
    listener.subscribe(f"{topic}/#", 2)
    sender = paho_client(port=broker.ports["ws"], transport="websockets")
    for qos in (0, 1, 2):
        sender.publish(f"{topic}/{qos}", f"qos {qos} over ws".encode(), qos)
    got = sorted((m.topic, m.payload) for m in listener.wait_messages(3))
    assert got == [(f"{topic}/{q}", f"qos {q} over ws".encode()) for q in (0, 1, 2)]


def test_the_default_loop_is_asyncios(shared_broker) -> None:
    assert shared_broker.proc is not None
    assert "uvloop/loop." not in _mapped(shared_broker.proc.pid)


def test_uvloop_with_cluster_discovery_is_refused(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "broker", "run", "--set", "node.event_loop=uvloop",
         "--set", "cluster.discovery_strategy=static", "--set", f"node.data_dir={tmp_path}",
         "--set", "listeners.tcp.default.bind=127.0.0.1:0",
         "--set", "listeners.ws.default.bind=127.0.0.1:0",
         "--set", "dashboard.listeners.http.bind=127.0.0.1:0"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "node.event_loop = uvloop is for a node alone" in result.stderr
