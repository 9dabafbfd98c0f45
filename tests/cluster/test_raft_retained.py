"""Retained messages on the metadata Raft group, with real broker processes on loopback: a
PUBACK means committed on a majority, whatever happens to the processes afterwards.

Three nodes started with `durable_storage.n_sites` 3 form one group of three voters. The
faults are real: SIGKILL (kill -9) of the leader under load, of every node at once, SIGSTOP
of a majority; each test checks what a new subscriber on each node sees against what the
publishers were told (PUBACK) and what they could not know (sent, no PUBACK).
"""

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as paho_mqtt
import pytest

from tests.cluster.conftest import Cluster, Node, http_json
from tests.integration.clients import PahoClient, unique, wait_until

THREE = {"durable_storage.n_sites": "3"}


@pytest.fixture
def clients() -> Iterator[list[PahoClient]]:
    made: list[PahoClient] = []
    yield made
    for client in made:
        client.close()


def _client(clients: list[PahoClient], node: Node, name: str = "c") -> PahoClient:
    client = PahoClient(node.process.tcp, unique(name))
    client.connect()
    clients.append(client)
    return client


def _group(node: Node) -> dict[str, Any] | None:
    groups = http_json(node.http, "/api/v5/raft")["groups"]
    return groups[0] if groups else None


def _site(node: Node) -> str:
    return str(http_json(node.http, "/api/v5/raft")["site"])


def _leader(nodes: list[Node], timeout: float = 30.0) -> Node:
    """The node every one of `nodes` names as the leader (one of them)."""
    sites = {_site(node): node for node in nodes}

    def agreed() -> Node | None:
        leaders = set()
        for node in nodes:
            group = _group(node)
            leaders.add(group["leader"] if group else None)
        leader = leaders.pop() if len(leaders) == 1 else None
        return sites.get(leader) if leader is not None else None

    return wait_until(agreed, timeout, "one leader all nodes agree on")


def _converged(nodes: list[Node], timeout: float = 30.0) -> int:
    """Waits until every node applied all its leader committed; returns that index."""
    def same() -> int:
        groups = [_group(node) for node in nodes]
        if any(g is None for g in groups):
            return 0
        indexes = {(g["commit"], g["applied"]) for g in groups if g is not None}
        if len(indexes) != 1:
            return 0
        commit, applied = indexes.pop()
        return applied if commit == applied else 0

    return int(wait_until(same, timeout, "every node applied the same commit index"))


def _retained(clients: list[PahoClient], node: Node, prefix: str, count: int
              ) -> dict[str, bytes]:
    """What a new subscriber on `node` gets for `prefix/#`: exactly `count` retained
    messages (a barrier proves nothing more came)."""
    subscriber = _client(clients, node, "late")
    subscriber.subscribe(f"{prefix}/#", qos=1)
    if count:
        subscriber.wait_messages(count, timeout=10)
    got = subscriber.barrier()
    assert all(message.retain for message in got)
    result = {message.topic: message.payload for message in got}
    assert len(result) == len(got) == count, f"{node.node_name}: {sorted(result)}"
    return result


class Publisher:
    """Sets one topic's retained message to 1, 2, 3... with QoS 1, each after the previous
    PUBACK, on its own thread; remembers what was sent and what was acknowledged."""

    def __init__(self, node: Node, topic: str) -> None:
        self.topic = topic
        self.client = PahoClient(node.process.tcp, unique("pub"))
        self.client.connect()
        self.sent = 0
        self.acked = 0
        self.stopped = threading.Event()
        self.progress = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        paho = self.client.client
        while not self.stopped.is_set():
            self.sent += 1
            info = paho.publish(self.topic, str(self.sent), 1, True)
            while not info.is_published():
                if self.stopped.is_set() or not self.client.connected:
                    return  # the node died, or the test is over: this one stays unknown
                info.wait_for_publish(0.2)
            with self.progress:
                self.acked = self.sent
                self.progress.notify_all()

    def wait_acked(self, count: int, timeout: float = 30.0) -> None:
        with self.progress:
            assert self.progress.wait_for(lambda: self.acked >= count, timeout), (
                f"{self.topic}: {self.acked} acknowledged, waiting for {count}")

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.client.close()

    def possible(self) -> set[bytes]:
        """What the topic may hold: the last acknowledged value, or the one sent after it
        (committed or not: its publisher never learnt)."""
        return {str(self.acked).encode(), str(self.sent).encode()}


def test_every_acknowledged_retained_message_survives_kill_9_of_the_leader_under_load(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3, **THREE)
    leader = _leader(nodes)
    survivors = [node for node in nodes if node is not leader]
    prefix = unique("load")
    publishers = [Publisher(node, f"{prefix}/{node.name}/{number}")
                  for node in nodes for number in range(3)]
    try:
        for publisher in publishers:
            publisher.thread.start()
        for publisher in publishers:
            publisher.wait_acked(10)
        leader.process.kill()  # SIGKILL
        on_survivors = [publisher for publisher in publishers
                        if not publisher.topic.startswith(f"{prefix}/{leader.name}/")]
        at_kill = {publisher.topic: publisher.acked for publisher in on_survivors}
        for publisher in on_survivors:  # the load goes on through the election
            publisher.wait_acked(at_kill[publisher.topic] + 10)
    finally:
        for publisher in publishers:
            publisher.stop()

    def check(node: Node) -> None:
        got = _retained(clients, node, prefix, len(publishers))
        for publisher in publishers:
            assert got[publisher.topic] in publisher.possible(), (
                f"{node.node_name}: {publisher.topic} holds {got[publisher.topic]!r};"
                f" acknowledged {publisher.acked}, sent {publisher.sent}")

    _converged(survivors)
    for node in survivors:
        check(node)
    leader.start()
    _converged(nodes)
    check(leader)


def test_the_retained_set_survives_kill_9_of_every_node_at_once(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3, **THREE)
    _leader(nodes)
    prefix = unique("all")
    expected: dict[str, bytes] = {}
    for index in range(30):
        node = nodes[index % 3]
        topic = f"{prefix}/{index}"
        publisher = _client(clients, node, "pub")
        publisher.publish(topic, f"v{index}", qos=1, retain=True, timeout=15)
        expected[topic] = f"v{index}".encode()
    cleaner = _client(clients, nodes[1], "clear")
    for index in range(0, 30, 5):  # cleared: must not come back from any replay
        cleaner.publish(f"{prefix}/{index}", b"", qos=1, retain=True, timeout=15)
        del expected[f"{prefix}/{index}"]
    for client in clients:
        client.close()
    clients.clear()
    for node in nodes:
        node.process.kill()
    for node in nodes:
        node.start()
    _leader(nodes)
    _converged(nodes)
    for node in nodes:
        assert _retained(clients, node, prefix, len(expected)) == expected
    # And the group goes on: a new value commits and reaches every node.
    _client(clients, nodes[2], "pub").publish(f"{prefix}/new", b"after", qos=1, retain=True,
                                              timeout=15)
    _converged(nodes)
    for node in nodes:
        assert _retained(clients, node, f"{prefix}/new", 1) == {f"{prefix}/new": b"after"}


def test_a_node_cut_off_from_a_frozen_majority_acknowledges_only_after_they_thaw(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3, **THREE)
    alone = _leader(nodes)  # the hardest case: the leader itself is cut off
    frozen = [node for node in nodes if node is not alone]
    publisher = _client(clients, alone, "pub")
    topic = unique("frozen")
    publisher.publish(topic, b"before", qos=1, retain=True, timeout=15)
    for node in frozen:
        os.kill(node.pid, signal.SIGSTOP)
    try:
        info = publisher.client.publish(topic, b"during", 1, True)
        # Three election timeouts: a leader that counted itself alone, or answered before
        # its majority did, would have acknowledged by now.
        info.wait_for_publish(3.0)
        assert not info.is_published(), "acknowledged with the majority frozen"
        assert publisher.connected
    finally:
        for node in frozen:
            os.kill(node.pid, signal.SIGCONT)
    info.wait_for_publish(30.0)
    assert info.is_published() and info.rc == paho_mqtt.MQTT_ERR_SUCCESS
    _leader(nodes)
    _converged(nodes)
    for node in nodes:
        assert _retained(clients, node, topic, 1) == {topic: b"during"}


@pytest.mark.parametrize("snapshot_interval", ["4096", "8"], ids=["log", "snapshot"])
def test_a_node_down_while_retained_messages_change_catches_up_when_it_returns(
        cluster: Cluster, clients: list[PahoClient], snapshot_interval: str) -> None:
    nodes = cluster.start(3, **THREE,
                          **{"durable_storage.raft.snapshot_interval": snapshot_interval})
    leader = _leader(nodes)
    away = next(node for node in nodes if node is not leader)
    prefix = unique("away")
    publisher = _client(clients, leader, "pub")
    for index in range(10):
        publisher.publish(f"{prefix}/{index}", b"old", qos=1, retain=True, timeout=15)
    behind = _converged(nodes)
    away.process.kill()
    expected = {f"{prefix}/{index}": b"old" for index in range(10)}
    for index in range(40):  # changed, cleared and new topics, while it is away
        topic = f"{prefix}/{index % 20}"
        if index % 7 == 3:
            publisher.publish(topic, b"", qos=1, retain=True, timeout=15)
            expected.pop(topic, None)
        else:
            publisher.publish(topic, f"new{index}", qos=1, retain=True, timeout=15)
            expected[topic] = f"new{index}".encode()
    if snapshot_interval == "8":  # the entries it missed are gone: it must get a snapshot
        wait_until(lambda: (_group(leader) or {}).get("snapshot_index", 0) > behind, 10,
                   "the leader's log compacted past what the node has")
    away.start()
    _converged(nodes)
    assert _retained(clients, away, prefix, len(expected)) == expected


def _members(node: Node) -> tuple[str, list[str], list[str]] | None:
    group = _group(node)
    if group is None:
        return None
    return group["epoch"], group["voters"], group["learners"]


def test_nodes_started_together_with_n_sites_1_form_one_group_that_follows_the_members(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3)  # durable_storage.n_sites 1: the smallest site coordinates
    sites = sorted(_site(node) for node in nodes)

    def one_group_of(voters: list[str]) -> bool:
        seen = {str(_members(node)) for node in nodes}
        return len(seen) == 1 and (_members(nodes[0]) or ("", []))[1] == voters

    wait_until(lambda: one_group_of(sites), 30, "one group, every node a voter")
    leader = _leader(nodes)
    assert leader.metric("raft_role", group="0", role="leader") == 1
    assert leader.metric("raft_wal_fsync_seconds_count") > 0
    status = subprocess.run(
        [sys.executable, "-m", "broker", "ctl", "raft", "status", "--url",
         f"http://127.0.0.1:{nodes[1].http}"], capture_output=True, text=True, timeout=30,
        check=True).stdout
    assert f"leader {leader.node_name}" in status
    assert all(node.node_name in status.split("voters")[1] for node in nodes)
    late = cluster.start(1)[0]
    late_site = _site(late)
    nodes.append(late)
    wait_until(lambda: one_group_of(sorted([*sites, late_site])), 30,
               "the late node added as a learner, then promoted")
    topic = unique("late")
    _client(clients, nodes[0], "pub").publish(topic, b"v", qos=1, retain=True, timeout=15)
    _converged(nodes)
    assert _retained(clients, late, topic, 1) == {topic: b"v"}
    # Killed and removed from the cluster: removed from the group too.
    late.process.kill()
    nodes.remove(late)
    http_json(nodes[0].http, f"/api/v5/cluster/{late.node_name}/force_leave", "DELETE")
    wait_until(lambda: one_group_of(sites), 30, "the removed node out of the group")


def test_a_node_that_ran_alone_adopts_the_clusters_group_when_it_joins(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3, **THREE)
    _leader(nodes)
    prefix = unique("join")
    _client(clients, nodes[0], "pub").publish(f"{prefix}/cluster", b"theirs", qos=1,
                                              retain=True, timeout=15)
    (alone,) = cluster.start(1, **{"cluster.discovery_strategy": "manual"})
    _client(clients, alone, "pub").publish(f"{prefix}/alone", b"mine", qos=1, retain=True,
                                           timeout=15)
    epoch = (_members(alone) or ("",))[0]
    assert epoch and epoch != (_members(nodes[0]) or ("",))[0]
    http_json(alone.http, "/api/v5/cluster/join", "POST", {"node": nodes[0].seed})
    everyone = [*nodes, alone]
    wait_until(lambda: len({str(_members(node)) for node in everyone}) == 1, 30,
               "the joined node in the cluster's group")
    _converged(everyone)
    for node in everyone:  # its own history is gone; the cluster's is its
        assert _retained(clients, node, prefix, 1) == {f"{prefix}/cluster": b"theirs"}
    # Leaving, it stands alone again: the group goes on without it, it has one of its own.
    joined_epoch = (_members(alone) or ("",))[0]
    alone_site = _site(alone)
    http_json(alone.http, "/api/v5/cluster/leave", "POST", {})
    wait_until(lambda: alone_site not in str(_members(nodes[0])), 30,
               "the node that left removed from the group")
    wait_until(lambda: (_members(alone) or ("", []))[1] == [alone_site], 30,
               "a group of its own")
    assert (_members(alone) or ("",))[0] != joined_epoch
    _client(clients, alone, "pub").publish(f"{prefix}/alone", b"again", qos=1, retain=True,
                                           timeout=15)
    assert _retained(clients, alone, prefix, 1) == {f"{prefix}/alone": b"again"}
