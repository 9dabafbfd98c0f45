"""The partition building block: front doors on the nodes' inter-node ports (proxy.py).

Nodes must learn only the doors (never dial a real port past them), any link can be cut
either way while the others keep working, and healing brings every link back."""

import json

import pytest

from broker.cluster.frames import Channel
from tests.cluster.conftest import Node, http_json
from tests.cluster.jepsen.harness import Harness
from tests.cluster.jepsen.proxy import rewrite
from tests.integration.clients import wait_until

pytestmark = pytest.mark.integration

PORTS = {5370: 40001, 5371: 40002}


def _json(data: bytes) -> object:
    return json.loads(data)


def test_the_advertised_port_is_rewritten_in_handshakes() -> None:
    hello = {"type": "hello", "v": 1, "cluster": "c", "site": "s1", "node": "n1@127.0.0.1",
             "host": "127.0.0.1", "port": 5370, "nonce": "x" * 32, "join": False}
    out = _json(rewrite(Channel.HANDSHAKE, json.dumps(hello).encode(), PORTS))
    assert out == {**hello, "port": 40001}
    response = json.dumps({"type": "response", "proof": "ab"}).encode()
    assert rewrite(Channel.HANDSHAKE, response, PORTS) == response


def test_gossiped_member_lists_name_the_doors() -> None:
    members = {"type": "members", "members": [
        {"site": "a", "node": "n1@127.0.0.1", "host": "127.0.0.1", "port": 5370},
        {"site": "b", "node": "n2@127.0.0.1", "host": "127.0.0.1", "port": 5371},
        {"site": "c", "node": "n3@127.0.0.1", "host": "127.0.0.1", "port": 40003}]}
    out = _json(rewrite(Channel.MEMBERSHIP, json.dumps(members).encode(), PORTS))
    assert [m["port"] for m in out["members"]] == [40001, 40002, 40003]  # type: ignore[index]


def test_other_frames_pass_unchanged() -> None:
    for channel, payload in [(Channel.FORWARD, b"\x01\x00\x00port 5370"),
                             (Channel.MEMBERSHIP, b"not json"),
                             (Channel.MEMBERSHIP, b'{"type":"leave"}'),
                             (Channel.RPC, json.dumps({"port": 5370}).encode())]:
        assert rewrite(channel, payload, PORTS) == payload


def _views(nodes: list[Node]) -> dict[str, dict[str, str]]:
    """observer -> {peer: status} for every pair of distinct nodes."""
    views = {}
    for node in nodes:
        seen = {e["node"].partition("@")[0]: e["node_status"]
                for e in http_json(node.http, "/api/v5/cluster")["nodes"]}
        views[node.name] = {peer: status for peer, status in seen.items() if peer != node.name}
    return views


def _expect(nodes: list[Node], cut: set[frozenset[str]], timeout: float = 20.0) -> None:
    expected = {node.name: {peer.name: ("stopped" if frozenset((node.name, peer.name)) in cut
                                        else "running")
                            for peer in nodes if peer is not node} for node in nodes}
    wait_until(lambda: _views(nodes) == expected, timeout, f"cluster views {expected}")


def test_nodes_know_only_the_doors(jepsen) -> None:
    harness: Harness = jepsen(doors=True)
    doors = harness.doors
    assert doors is not None
    real = {node.rpc_port for node in harness.nodes}
    for node in harness.nodes:
        addresses = {e["address"] for e in http_json(node.http, "/api/v5/cluster")["nodes"]
                     if e["node"] != node.node_name}
        assert addresses == {f"127.0.0.1:{doors.door_ports[peer.name]}"
                             for peer in harness.nodes if peer is not node}
        members = json.loads((node.process.data_dir / "cluster" / "members.json").read_text())
        assert not {member["port"] for member in members["members"]} & real
    assert doors.links() == {frozenset(p) for p in [("n1", "n2"), ("n1", "n3"), ("n2", "n3")]}


def test_an_isolated_node_and_a_cut_link_then_heal(jepsen) -> None:
    harness: Harness = jepsen(doors=True)
    nodes, nemesis, doors = harness.nodes, harness.nemesis, harness.doors
    assert doors is not None
    nemesis.partition(["n1"], ["n2", "n3"])
    cut = {frozenset(("n1", "n2")), frozenset(("n1", "n3"))}
    assert doors.cuts() == cut
    _expect(nodes, cut)
    assert doors.links() == {frozenset(("n2", "n3"))}
    nemesis.heal()
    _expect(nodes, set())

    nemesis.cut("n1", "n2")  # a bridge: n3 still sees both
    _expect(nodes, {frozenset(("n1", "n2"))})
    nemesis.heal()
    _expect(nodes, set())
    assert len(doors.links()) == 3


def test_a_node_restarted_behind_its_door_comes_back_through_it(jepsen) -> None:
    harness: Harness = jepsen(doors=True)
    doors = harness.doors
    assert doors is not None
    first, second, third = harness.nodes
    harness.nemesis.kill("n2")
    harness.cluster.wait_statuses([first, third], {second.node_name: "stopped"})
    harness.nemesis.restart("n2")
    _expect(harness.nodes, set())
    assert len(doors.links()) == 3
