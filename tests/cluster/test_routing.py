"""Routing across real broker processes: forwarding, shared groups, retained messages."""

import os
import signal

import pytest

from tests.cluster.conftest import Cluster, Node, http_json
from tests.integration.clients import PahoClient, unique, wait_until


def _client(clients: list[PahoClient], node: Node, name: str = "c") -> PahoClient:
    client = PahoClient(node.process.tcp, unique(name))
    client.connect()
    clients.append(client)
    return client


def _routes_seen(node: Node, count: int) -> None:
    wait_until(lambda: node.metric("mqtt_cluster_routes") >= count, 10,
               f"{count} remote routes on {node.node_name}")


def test_every_subscriber_gets_every_message_from_any_node_in_order(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3)
    cluster.all_running(nodes)
    topic = unique("t").replace("-", "/")
    subscribers = [_client(clients, node, "sub") for node in nodes]
    for subscriber in subscribers:
        subscriber.subscribe(f"{topic}/#", qos=1)
    for node in nodes:
        _routes_seen(node, 2)  # the other two nodes' plain route for the filter
    publishers = [_client(clients, node, "pub") for node in nodes]
    for round_ in range(20):
        for index, publisher in enumerate(publishers):
            publisher.publish(f"{topic}/{index}", f"{index}:{round_}", qos=1)
    expected = {f"{index}:{round_}" for index in range(3) for round_ in range(20)}
    for subscriber in subscribers:
        wait_until(lambda s=subscriber: len(s.messages) >= 60, 15, "60 messages")
        payloads = [m.payload.decode() for m in subscriber.messages]
        assert set(payloads) == expected and len(payloads) == 60
        for index in range(3):  # per publisher order, across nodes
            mine = [p for p in payloads if p.startswith(f"{index}:")]
            assert mine == [f"{index}:{r}" for r in range(20)]
    # Forwarded once per node, not once per subscriber: 2 subscribers elsewhere, 2 nodes.
    forwarded = nodes[0].metric("mqtt_cluster_forwarded_messages_total", peer=nodes[1].node_name)
    assert forwarded == 20


@pytest.mark.parametrize("strategy", ["round_robin", "random", "hash_clientid", "sticky",
                                      "local"])
def test_a_shared_group_over_three_nodes_gets_each_message_once(
        cluster: Cluster, clients: list[PahoClient], strategy: str) -> None:
    nodes = cluster.start(3, **{"mqtt.shared_subscription_strategy": strategy})
    cluster.all_running(nodes)
    topic = unique("s").replace("-", "/")
    members = [_client(clients, node, "member") for node in nodes for _ in range(2)]
    for member in members:
        member.subscribe(f"$share/g/{topic}", qos=1)
    for node in nodes:
        _routes_seen(node, 4)  # the 4 members on the other nodes
    publisher = _client(clients, nodes[0], "pub")
    for number in range(60):
        publisher.publish(topic, str(number), qos=1)

    def total() -> int:
        return sum(len(member.messages) for member in members)

    wait_until(lambda: total() >= 60, 15, "60 deliveries")
    got = sorted(int(m.payload) for member in members for m in member.messages)
    assert got == list(range(60))
    holders = sum(1 for member in members if member.messages)
    if strategy in ("round_robin", "random"):
        assert holders == 6
    elif strategy in ("hash_clientid", "sticky"):
        assert holders == 1
    else:  # local: the publisher's node has members
        assert {m.client_id for m in members if m.messages} <= {
            m.client_id for m in members[:2]}


def test_retained_messages_are_seen_on_every_node_and_survive_losing_one(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3)
    cluster.all_running(nodes)
    topic = unique("r").replace("-", "/")
    _client(clients, nodes[0], "pub").publish(topic, b"kept", qos=1, retain=True)
    for node in nodes[1:]:  # replicated after the PUBACK, not before
        wait_until(lambda n=node: n.metric("mqtt_retained_messages") == 1, 10, "replicated")
    nodes[0].process.kill()
    for node in nodes[1:]:
        subscriber = _client(clients, node, "late")
        subscriber.subscribe(topic, qos=1)
        wait_until(lambda s=subscriber: s.messages, 10, "the retained message")
        assert subscriber.messages[0].payload == b"kept" and subscriber.messages[0].retain


def test_a_dead_nodes_routes_are_purged_and_come_back(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3)
    cluster.all_running(nodes)
    subscriber = PahoClient(nodes[2].process.tcp, unique("sub"))
    subscriber.connect(clean_start=False, session_expiry=0)
    subscriber.subscribe("purge/#", qos=0)
    clients.append(subscriber)
    _routes_seen(nodes[0], 1)
    nodes[2].process.kill()
    wait_until(lambda: nodes[0].metric("mqtt_cluster_routes") == 0, 10, "routes purged")
    nodes[2].start()
    again = _client(clients, nodes[2], "sub2")
    again.subscribe("purge/#", qos=0)
    _routes_seen(nodes[0], 1)
    rows = http_json(nodes[0].http, "/api/v5/cluster")["nodes"]
    assert len(rows) == 3


def test_killing_a_node_mid_traffic_leaves_the_others_routing(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """A publisher on node 1 streams to subscribers on nodes 2 and 3; node 3 dies by kill -9
    in the middle. Node 2's subscriber still gets every message, in order, and node 3's
    routes leave node 1's table within the failure detector's bound."""
    nodes = cluster.start(3)
    cluster.all_running(nodes)
    topic = unique("flow").replace("-", "/")
    survivor, doomed = _client(clients, nodes[1], "keep"), _client(clients, nodes[2], "gone")
    survivor.subscribe(topic, qos=1)
    doomed.subscribe(topic, qos=1)
    _routes_seen(nodes[0], 2)
    publisher = _client(clients, nodes[0], "pub")
    total = 300
    for index in range(total):
        if index == total // 3:
            nodes[2].process.kill()
        publisher.publish(topic, str(index), qos=1)
    got = survivor.wait_messages(total, timeout=30)
    assert [m.payload for m in got] == [str(i).encode() for i in range(total)]
    # node.dist_net_ticktime is 2 s in these tests: purged well within 10 s.
    wait_until(lambda: nodes[0].metric("mqtt_cluster_routes") == 1, 10, "node 3's route gone")


def test_a_thawed_node_comes_back_without_duplicate_routes(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3)
    cluster.all_running(nodes)
    topic = unique("thaw").replace("-", "/")
    subscriber = _client(clients, nodes[1], "frozen-sub")
    subscriber.subscribe(topic, qos=1)
    _routes_seen(nodes[0], 1)
    os.kill(nodes[1].pid, signal.SIGSTOP)
    try:
        wait_until(lambda: nodes[0].metric("mqtt_cluster_routes") == 0, 10, "routes purged")
    finally:
        os.kill(nodes[1].pid, signal.SIGCONT)
    cluster.all_running(nodes)
    _routes_seen(nodes[0], 1)
    assert nodes[0].metric("mqtt_cluster_routes") == 1
    assert nodes[2].metric("mqtt_cluster_routes") == 1
    publisher = _client(clients, nodes[0], "pub")
    publisher.publish(topic, "once", qos=1)
    subscriber.wait_messages(1)
    barrier_topic = unique("barrier")
    subscriber.subscribe(barrier_topic, qos=1)
    _routes_seen(nodes[0], 2)
    publisher.publish(barrier_topic, "after", qos=1)
    subscriber.wait_message_on(barrier_topic)
    assert [m.payload for m in subscriber.messages if m.topic == topic] == [b"once"]
