"""Replicated Durable Storage (`builtin_raft`) across real broker processes: a durable
session outlives its node, acknowledged messages included; a minority acknowledges nothing."""

import os
import signal
import time

from broker.ds.db import shard_of
from tests.cluster.conftest import Cluster, Node, http_json
from tests.integration.clients import PahoClient, unique, wait_until

REPLICATED = {"durable_storage.messages.backend": "builtin_raft",
              "durable_storage.n_sites": "3", "durable_storage.messages.n_shards": "4"}


def _client(clients: list[PahoClient], node: Node, client_id: str) -> PahoClient:
    client = PahoClient(node.process.tcp, client_id)
    clients.append(client)
    return client


def _groups_led(nodes: list[Node], count: int) -> None:
    """Every node hosts `count` groups and each has a leader."""
    def ready() -> bool:
        for node in nodes:
            groups = http_json(node.http, "/api/v5/raft")["groups"]
            if len(groups) < count or any(group["leader"] is None for group in groups):
                return False
        return True

    wait_until(ready, 30, f"{count} Raft groups with leaders on every node")


def _filters_everywhere(nodes: list[Node], count: int) -> None:
    """Every node knows `count` durable filters (the replicated subscriptions applied)."""
    wait_until(lambda: all(node.metric("mqtt_durable_filters") >= count for node in nodes),
               10, f"{count} durable filter(s) on every node")


def _start(cluster: Cluster, **settings: str) -> list[Node]:
    nodes = cluster.start(3, **REPLICATED, **settings)
    cluster.all_running(nodes)
    _groups_led(nodes, 1 + 1 + 4)  # metadata, sessions, 4 shards
    cluster.wait_version(nodes)  # durable shared groups are joined from cluster version 1
    return nodes


def test_a_durable_session_resumes_on_another_node_after_its_node_is_killed(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = _start(cluster)
    client_id, topic = unique("survivor"), unique("rep").replace("-", "/")
    subscriber = _client(clients, nodes[0], client_id)
    subscriber.connect(clean_start=False, session_expiry=3600)
    subscriber.subscribe(f"{topic}/#", qos=1)
    subscriber.disconnect()
    _filters_everywhere(nodes, 1)
    publisher = _client(clients, nodes[1], unique("pub"))
    publisher.connect()
    sent = [f"m{i}".encode() for i in range(50)]
    for i, payload in enumerate(sent):
        assert publisher.publish(f"{topic}/{i % 5}", payload, qos=1) == 0
    nodes[0].process.kill()  # kill -9 of the node that owned the session
    resumed = _client(clients, nodes[2], client_id)
    assert resumed.connect(clean_start=False, session_expiry=3600).session_present
    received = resumed.wait_messages(len(sent), timeout=30)
    assert sorted(m.payload for m in received) == sorted(sent)
    assert nodes[2].metric("mqtt_cluster_takeovers_total", outcome="resumed") == 1


def test_messages_for_a_session_on_another_node_are_stored_once(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """The publishing node stores a message for a durable session on another node: the
    session reads it from its own replica, once, and no node forwards it a second time."""
    nodes = _start(cluster)
    client_id, topic = unique("reader"), unique("once").replace("-", "/")
    subscriber = _client(clients, nodes[0], client_id)
    subscriber.connect(clean_start=False, session_expiry=3600)
    subscriber.subscribe(f"{topic}/#", qos=1)
    _filters_everywhere(nodes, 1)
    publisher = _client(clients, nodes[1], unique("pub"))
    publisher.connect()
    for i in range(20):
        assert publisher.publish(f"{topic}/x", f"{i}".encode(), qos=1) == 0
    received = subscriber.wait_messages(20, timeout=30)
    assert [m.payload for m in received] == [f"{i}".encode() for i in range(20)]
    subscriber.barrier()
    assert len(subscriber.messages) == 20
    assert sum(node.metric("ds_messages_total") for node in nodes) == 3 * 20  # 20 on each replica


def test_a_minority_never_acknowledges_a_durable_publish(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = _start(cluster, **{"durable_storage.raft.commit_timeout": "3s"})
    subscriber = _client(clients, nodes[0], unique("sub"))
    subscriber.connect(clean_start=False, session_expiry=3600)
    topic = unique("minority").replace("-", "/")
    subscriber.subscribe(f"{topic}/#", qos=1)
    _filters_everywhere(nodes, 1)
    for node in nodes[1:]:
        os.kill(node.pid, signal.SIGSTOP)
    try:
        publisher = _client(clients, nodes[0], unique("pub"))
        # The CONNECT waits for the frozen peers' answers, then for a barrier through the
        # log that cannot commit (3 s): a Clean Start goes on without it.
        publisher.connect(timeout=20)
        info = publisher.client.publish(f"{topic}/x", b"unacknowledged", 1)
        started = time.monotonic()
        reason = publisher.wait_disconnected(timeout=20)
        assert time.monotonic() - started >= 2.5
        assert info.mid not in publisher._published  # no PUBACK came
        assert reason != 0
    finally:
        for node in nodes[1:]:
            os.kill(node.pid, signal.SIGCONT)



def test_a_durable_subscription_is_acknowledged_once_a_majority_has_it(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """No SUBACK while the sessions group cannot commit; once it has, a kill -9 of every
    node keeps the subscription: Session Present 1, and it gets what is published next."""
    nodes = _start(cluster)
    client_id, topic = unique("sub"), unique("subacked").replace("-", "/")
    subscriber = _client(clients, nodes[0], client_id)
    subscriber.connect(clean_start=False, session_expiry=3600)
    for node in nodes[1:]:
        os.kill(node.pid, signal.SIGSTOP)
    try:
        _, mid = subscriber.client.subscribe([(f"{topic}/#", 1)])
        # Three election timeouts: an acknowledgement before the commit would be here.
        time.sleep(3.0)
        assert mid not in subscriber._subacks, "SUBACK before a majority had the subscription"
    finally:
        for node in nodes[1:]:
            os.kill(node.pid, signal.SIGCONT)
    wait_until(lambda: mid in subscriber._subacks, 30, "the SUBACK, once committed")
    for node in nodes:
        node.process.kill()
    for node in nodes:
        node.start()
    cluster.all_running(nodes)
    _groups_led(nodes, 1 + 1 + 4)
    back = _client(clients, nodes[1], client_id)
    assert back.connect(clean_start=False, session_expiry=3600).session_present
    publisher = _client(clients, nodes[2], unique("pub"))
    publisher.connect()
    publisher.publish(f"{topic}/x", b"after", qos=1)
    assert back.wait_message_on(f"{topic}/x").payload == b"after"


def test_a_node_that_cannot_commit_stops_promptly_on_sigterm(cluster: Cluster) -> None:
    """A write waiting for a commit that cannot come (the other nodes frozen here; a node
    drained out of every group, on Kubernetes) is given up at shutdown: SIGTERM ends the
    process within the settle time, not after the commit timeout (or the kubelet's kill)."""
    nodes = _start(cluster, **{"durable_sessions.heartbeat_interval": "1s",
                               "durable_storage.raft.commit_timeout": "120s"})
    for node in nodes[1:]:
        os.kill(node.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: nodes[0].metric("mqtt_durable_state_writes_pending") >= 1, 10,
                   "a heartbeat waiting for its commit")
        assert nodes[0].process.stop(timeout=20) == 0
    finally:
        for node in nodes[1:]:
            os.kill(node.pid, signal.SIGCONT)


def _leader_of(node: Node, name: str) -> str | None:
    for group in http_json(node.http, "/api/v5/raft")["groups"]:
        if group["name"] == name:
            return group["leader"]  # type: ignore[no-any-return]
    return None


def test_killing_a_shard_leader_delays_acknowledgements_and_loses_nothing(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """The shard's leader dies with PUBLISHes in flight: a new leader is elected, the
    publisher (on a surviving node) gets every acknowledgement, none refused, and the
    durable subscriber every acknowledged message."""
    nodes = _start(cluster)
    sites = {http_json(node.http, "/api/v5/raft")["site"]: node for node in nodes}
    publisher_id = next(f"pub-{i}" for i in range(1000) if shard_of(f"pub-{i}", 4) == 0)
    leader = sites[_leader_of(nodes[0], "messages shard 0")]
    survivors = [node for node in nodes if node is not leader]
    topic = unique("failover").replace("-", "/")
    subscriber = _client(clients, survivors[0], unique("sub"))
    subscriber.connect(clean_start=False, session_expiry=3600)
    subscriber.subscribe(f"{topic}/#", qos=1)
    _filters_everywhere(nodes, 1)
    publisher = _client(clients, survivors[1], publisher_id)
    publisher.connect()
    for i in range(20):
        assert publisher.publish(f"{topic}/x", f"{i}".encode(), qos=1) == 0
    leader.process.kill()
    killed = time.monotonic()
    for i in range(20, 40):
        assert publisher.publish(f"{topic}/x", f"{i}".encode(), qos=1, timeout=30) == 0
    elected = time.monotonic() - killed
    new_leader = _leader_of(survivors[0], "messages shard 0")
    assert new_leader is not None and sites[new_leader] is not leader
    assert elected < 10, f"acknowledgements resumed {elected:.1f} s after the leader died"
    received = subscriber.wait_messages(40, timeout=30)
    assert sorted(int(m.payload) for m in received) == list(range(40))


def test_sessions_of_a_node_gone_for_good_end_once_they_expire(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """n1 dies for good holding two durable sessions: one whose client had left, one whose
    client was still connected. Their expiry timers died with n1; the `sessions` group's
    leader ends them once they expire (from the client's leaving, from n1's last heartbeat),
    so no node stores messages for them any more and neither resumes."""
    nodes = _start(cluster, **{"durable_sessions.session_gc_interval": "1s",
                               "durable_sessions.heartbeat_interval": "1s"})
    topic = unique("orphan").replace("-", "/")
    left_id, stayed_id = unique("left"), unique("stayed")
    left = _client(clients, nodes[0], left_id)
    left.connect(clean_start=False, session_expiry=3)
    left.subscribe(f"{topic}/left", qos=1)
    left.disconnect()
    stayed = _client(clients, nodes[0], stayed_id)
    stayed.connect(clean_start=False, session_expiry=3)
    stayed.subscribe(f"{topic}/stayed", qos=1)
    _filters_everywhere(nodes, 2)
    nodes[0].process.kill()
    survivors = nodes[1:]
    wait_until(lambda: all(node.metric("mqtt_durable_filters") == 0 for node in survivors),
               30, "the gone node's sessions ended on every survivor")
    for client_id in (left_id, stayed_id):
        back = _client(clients, survivors[1], client_id)
        assert not back.connect(clean_start=False, session_expiry=0).session_present
        back.disconnect()


def test_ended_sessions_epochs_are_forgotten_after_tombstone_ttl(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """A session that ends leaves a tombstone on every replica (its epoch, fencing off a
    node that still held it); the `sessions` group's leader has them forgotten once older
    than durable_sessions.tombstone_ttl, so ended client IDs do not grow the database."""
    nodes = _start(cluster, **{"durable_sessions.session_gc_interval": "1s",
                               "durable_sessions.tombstone_ttl": "2s"})
    client_ids = [unique("ended") for _ in range(3)]
    for client_id in client_ids:
        client = _client(clients, nodes[0], client_id)
        client.connect(clean_start=False, session_expiry=1)
        client.disconnect()  # the session ends a second later, by its expiry

    def swept() -> float:
        return sum(node.metric("mqtt_durable_session_tombstones_swept_total")
                   for node in nodes)

    wait_until(lambda: swept() >= len(client_ids), 30, "the tombstones swept")
    assert swept() == len(client_ids)
    again = _client(clients, nodes[1], client_ids[0])
    assert not again.connect(clean_start=False, session_expiry=60).session_present


def test_a_message_published_on_another_node_right_after_the_suback_is_stored(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """Every node stores for a durable subscription once it has applied it: the SUBACK
    waits for the nodes it reaches to have, so a publish on any of them after the SUBACK
    (here at once, on a connection already open) is stored for it, not lost."""
    nodes = _start(cluster)
    subscriber = _client(clients, nodes[0], unique("sub"))
    subscriber.connect(clean_start=False, session_expiry=3600)
    publishers = [_client(clients, node, unique("pub")) for node in nodes[1:]]
    for publisher in publishers:
        publisher.connect()
    base = unique("right-after").replace("-", "/")
    sent = []
    for i in range(30):
        topic = f"{base}/{i}"
        assert subscriber.subscribe(topic, qos=1) == [1]
        assert publishers[i % 2].publish(topic, f"{i}".encode(), qos=1) == 0
        sent.append(f"{i}".encode())
    received = subscriber.wait_messages(len(sent), timeout=30)
    assert sorted(m.payload for m in received) == sorted(sent)
