"""One owner per client ID across real broker processes: takeover, session move, races,
convergence after a partition, and the cluster-wide client and subscription lists."""

import os
import signal
import threading

from tests.cluster.conftest import Cluster, Node, http_json
from tests.integration.clients import PahoClient, unique, wait_until

MEMORY_SESSIONS = {"durable_sessions.enable": "false"}


def _client(clients: list[PahoClient], node: Node, client_id: str,
            **options: bool) -> PahoClient:
    client = PahoClient(node.process.tcp, client_id, **options)
    clients.append(client)
    return client


def _entries(node: Node, client_id: str) -> list[dict[str, object]]:
    listed = http_json(node.http, "/api/v5/clients?limit=10000")["data"]
    return [entry for entry in listed if entry["clientid"] == client_id]


def _routes_seen(node: Node, count: int) -> None:
    wait_until(lambda: node.metric("mqtt_cluster_routes") >= count, 10,
               f"{count} remote routes on {node.node_name}")


def test_connect_on_another_node_takes_over_and_moves_the_session(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """The old connection gets 0x8E; the session arrives with its subscriptions, its
    unacknowledged in-flight messages (sent again with DUP) and its queue, in order."""
    nodes = cluster.start(3, **MEMORY_SESSIONS)
    cluster.all_running(nodes)
    client_id, topic = unique("mover"), unique("t").replace("-", "/")
    old = _client(clients, nodes[0], client_id, manual_ack=True)
    old.connect(clean_start=False, session_expiry=300)
    old.subscribe(f"{topic}/#", qos=1)
    _routes_seen(nodes[1], 1)
    publisher = _client(clients, nodes[1], unique("pub"))
    publisher.connect()
    for index in range(5):
        publisher.publish(f"{topic}/a", f"m{index}", qos=1)
    old.wait_messages(5)  # delivered, never acknowledged: in flight on node 1

    new = _client(clients, nodes[2], client_id)
    connack = new.connect(clean_start=False, session_expiry=300)
    assert connack.session_present
    assert old.wait_disconnected() == 0x8E
    resent = new.wait_messages(5)
    assert [m.payload for m in resent] == [f"m{i}".encode() for i in range(5)]
    assert all(m.dup for m in resent)

    # The subscription moved too: what is published now reaches the client on node 3.
    _routes_seen(nodes[1], 1)
    wait_until(lambda: not _entries(nodes[0], client_id) or
               all(e["node"] == nodes[2].node_name for e in _entries(nodes[0], client_id)),
               10, "the session gone from node 1")
    for index in range(5, 10):
        publisher.publish(f"{topic}/b", f"m{index}", qos=1)
    later = new.wait_messages(10)
    assert [m.payload for m in later[5:]] == [f"m{i}".encode() for i in range(5, 10)]
    listed = _entries(nodes[1], client_id)
    assert [(e["node"], e["connected"]) for e in listed] == [(nodes[2].node_name, True)]
    assert nodes[2].metric("mqtt_cluster_takeovers_total", outcome="moved_in") == 1
    assert nodes[0].metric("mqtt_cluster_takeovers_total", outcome="moved_out") == 1


def test_queued_messages_of_an_offline_session_move_with_it(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(2, **MEMORY_SESSIONS)
    cluster.all_running(nodes)
    client_id, topic = unique("away"), unique("q").replace("-", "/")
    first = _client(clients, nodes[0], client_id)
    first.connect(clean_start=False, session_expiry=300)
    first.subscribe(topic, qos=1)
    first.disconnect()
    _routes_seen(nodes[1], 1)
    publisher = _client(clients, nodes[1], unique("pub"))
    publisher.connect()
    for index in range(20):
        publisher.publish(topic, f"q{index}", qos=1)
    wait_until(lambda: _entries(nodes[0], client_id)[0]["mqueue_len"] == 20, 10,
               "20 messages queued on node 1")
    back = _client(clients, nodes[1], client_id)
    assert back.connect(clean_start=False, session_expiry=300).session_present
    got = back.wait_messages(20)
    assert [m.payload for m in got] == [f"q{i}".encode() for i in range(20)]


def test_clean_start_elsewhere_ends_the_old_session_and_its_will_goes_out(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(2, **MEMORY_SESSIONS)
    cluster.all_running(nodes)
    client_id, will_topic = unique("willed"), unique("will").replace("-", "/")
    watcher = _client(clients, nodes[1], unique("watch"))
    watcher.connect()
    watcher.subscribe(will_topic, qos=1)
    _routes_seen(nodes[0], 1)
    old = _client(clients, nodes[0], client_id)
    old.connect(clean_start=False, session_expiry=300,
                will={"topic": will_topic, "payload": b"gone", "qos": 1})
    old.subscribe("x/y", qos=1)
    new = _client(clients, nodes[1], client_id)
    assert not new.connect(clean_start=True).session_present
    assert old.wait_disconnected() == 0x8E
    assert watcher.wait_message_on(will_topic).payload == b"gone"
    assert [e["node"] for e in _entries(nodes[0], client_id)] == [nodes[1].node_name]


def test_simultaneous_connects_on_two_nodes_leave_exactly_one(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(2, **MEMORY_SESSIONS)
    cluster.all_running(nodes)
    for round_ in range(5):
        client_id = unique(f"race{round_}")
        pair = [_client(clients, node, client_id) for node in nodes]
        start = threading.Barrier(2)
        threads = [threading.Thread(target=_connect_at, args=(c, start)) for c in pair]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wait_until(lambda p=pair: sum(c.connected for c in p) == 1, 10,
                   "exactly one of the two connections left")
        entries = _entries(nodes[0], client_id)
        assert sum(1 for e in entries if e["connected"]) == 1, entries


def _connect_at(client: PahoClient, start: threading.Barrier) -> None:
    start.wait()
    client.connect(session_expiry=60, expect_success=False)


def test_durable_session_elsewhere_answers_use_another_server(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(2)  # durable sessions on (the default)
    cluster.all_running(nodes)
    client_id = unique("durable")
    first = _client(clients, nodes[0], client_id)
    first.connect(clean_start=False, session_expiry=300)
    first.subscribe("d/#", qos=1)
    first.disconnect()
    elsewhere = _client(clients, nodes[1], client_id)
    refused = elsewhere.connect(clean_start=False, session_expiry=300, expect_success=False)
    assert refused.reason_code == 0x9C
    assert refused.prop("ServerReference") == f"127.0.0.1:{nodes[0].process.tcp}"
    home = _client(clients, nodes[0], client_id)
    assert home.connect(clean_start=False, session_expiry=300).session_present


def test_a_partition_heals_to_the_newer_connection(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """Each side accepts the ID while they cannot talk; once linked again the older
    connection is ended with 0x8E and the newer one stays."""
    nodes = cluster.start(2, **MEMORY_SESSIONS)
    cluster.all_running(nodes)
    client_id = unique("split")
    older = _client(clients, nodes[0], client_id)
    older.connect()
    os.kill(nodes[0].pid, signal.SIGSTOP)
    try:
        cluster.wait_statuses([nodes[1]], {nodes[0].node_name: "stopped"}, timeout=10)
        newer = _client(clients, nodes[1], client_id)
        newer.connect()  # node 1 is unreachable: accepted alone
    finally:
        os.kill(nodes[0].pid, signal.SIGCONT)
    assert older.wait_disconnected(timeout=20) == 0x8E
    assert newer.connected
    cluster.all_running(nodes)
    entries = _entries(nodes[0], client_id)
    assert [(e["node"], e["connected"]) for e in entries if e["connected"]] == [
        (nodes[1].node_name, True)]


def test_clients_and_subscriptions_are_listed_for_the_whole_cluster(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3)
    cluster.all_running(nodes)
    prefix = unique("listed")
    for index, node in enumerate(nodes):
        client = _client(clients, node, f"{prefix}-{index}")
        client.connect()
        client.subscribe(f"{prefix}/{index}", qos=1)
    for node in nodes:
        listed = http_json(node.http, "/api/v5/clients?limit=10000")["data"]
        mine = sorted((e["clientid"], e["node"]) for e in listed
                      if e["clientid"].startswith(prefix))
        assert mine == [(f"{prefix}-{i}", nodes[i].node_name) for i in range(3)]
        subscriptions = http_json(node.http, "/api/v5/subscriptions?limit=10000")["data"]
        assert sorted((s["topic"], s["node"]) for s in subscriptions
                      if s["clientid"].startswith(prefix)) == [
            (f"{prefix}/{i}", nodes[i].node_name) for i in range(3)]
    only = http_json(nodes[0].http, f"/api/v5/clients?node={nodes[2].node_name}&limit=10000")
    assert [e["clientid"] for e in only["data"] if e["clientid"].startswith(prefix)] == [
        f"{prefix}-2"]
    one = http_json(nodes[0].http, f"/api/v5/clients/{prefix}-1")
    assert one["node"] == nodes[1].node_name and one["connected"]
