"""node.event_loop: the broker runs on uvloop when asked, for TCP and WebSocket clients
alike (a cluster on uvloop: tests/cluster/test_uvloop.py)."""

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

