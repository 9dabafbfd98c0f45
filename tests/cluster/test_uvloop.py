"""A cluster on uvloop: its links run on uvloop's transports, which are not subclasses of
asyncio's, and carry membership and routes as asyncio's do."""

from pathlib import Path

from tests.cluster.conftest import Cluster, Node
from tests.integration.clients import PahoClient, unique, wait_until


def _client(clients: list[PahoClient], node: Node, name: str) -> PahoClient:
    client = PahoClient(node.process.tcp, unique(name))
    client.connect()
    clients.append(client)
    return client


def test_two_nodes_on_uvloop_form_a_cluster_and_route(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(2, **{"node.event_loop": "uvloop"})
    for node in nodes:
        assert "uvloop/loop." in Path(f"/proc/{node.pid}/maps").read_text()
    cluster.all_running(nodes)
    topic = unique("uv")
    subscriber = _client(clients, nodes[1], "sub")
    subscriber.subscribe(f"{topic}/#", qos=1)
    wait_until(lambda: nodes[0].metric("mqtt_cluster_routes") >= 1, 10,
               "the subscriber's route on the other node")
    _client(clients, nodes[0], "pub").publish(f"{topic}/a", "across", qos=1)
    assert [m.payload for m in subscriber.wait_messages(1)] == [b"across"]
