"""Graceful stop across real broker processes: on SIGTERM a node hands the leadership of the
Raft groups it leads to other nodes (TimeoutNow, not an election timeout), then tells its
MQTT 5 clients it is shutting down; a QoS 1 publisher on another node loses nothing."""

import threading

import pytest

from broker.ds.db import shard_of
from tests.cluster.conftest import Cluster, Node, http_json
from tests.integration.clients import PahoClient, unique, wait_until

REPLICATED = {"durable_storage.messages.backend": "builtin_raft",
              "durable_storage.n_sites": "3", "durable_storage.messages.n_shards": "4"}
GROUPS = 1 + 1 + 4  # metadata, sessions, 4 shards
SERVER_SHUTTING_DOWN = 0x8B


def _groups(node: Node) -> list[dict[str, object]]:
    return http_json(node.http, "/api/v5/raft")["groups"]  # type: ignore[no-any-return]


def _transfer_elections(node: Node, group: object) -> float:
    return node.metric("raft_transfer_elections_total", group=str(group))


def _elections(node: Node, group: object) -> float:
    return node.metric("raft_elections_total", group=str(group))


class Publisher(threading.Thread):
    """QoS 1 PUBLISHes one after another until told to stop; keeps what was acknowledged."""

    def __init__(self, client: PahoClient, topic: str) -> None:
        super().__init__(daemon=True)
        self.client, self.topic = client, topic
        self.acknowledged: list[int] = []
        self.refused: list[tuple[int, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.done.is_set():
            reason = self.client.publish(self.topic, str(i).encode(), qos=1, timeout=60)
            if reason:
                self.refused.append((i, reason))
            else:
                self.acknowledged.append(i)
            i += 1


@pytest.mark.parametrize("graceful", [True, False], ids=["hand-over", "no-hand-over"])
def test_sigterm_hands_the_led_groups_over_before_the_node_exits(
        cluster: Cluster, clients: list[PahoClient], graceful: bool) -> None:
    settings = {} if graceful else {"node.graceful_stop_timeout": "0"}
    nodes = cluster.start(3, **REPLICATED, **settings)
    cluster.all_running(nodes)
    wait_until(lambda: all(len(_groups(n)) == GROUPS and all(g["leader"] for g in _groups(n))
                           for n in nodes), 30, "every group led, on every node")
    sites = {http_json(node.http, "/api/v5/raft")["site"]: node for node in nodes}
    shard0 = next(g for g in _groups(nodes[0]) if g["name"] == "messages shard 0")
    stopping = sites[shard0["leader"]]
    survivors = [node for node in nodes if node is not stopping]
    led = [g["id"] for g in _groups(stopping) if g["role"] == "leader"]
    before = {(id(n), group): (_transfer_elections(n, group), _elections(n, group))
              for n in survivors for group in led}

    topic = unique("graceful").replace("-", "/")
    subscriber = PahoClient(survivors[0].process.tcp, unique("sub"))
    clients.append(subscriber)
    subscriber.connect(clean_start=False, session_expiry=3600)
    subscriber.subscribe(f"{topic}/#", qos=1)
    wait_until(lambda: all(n.metric("mqtt_durable_filters") >= 1 for n in nodes), 10,
               "the durable filter on every node")
    # Its messages go to shard 0, which the stopping node leads.
    publisher_id = next(f"pub-{i}" for i in range(1000) if shard_of(f"pub-{i}", 4) == 0)
    publisher_client = PahoClient(survivors[1].process.tcp, publisher_id)
    clients.append(publisher_client)
    publisher_client.connect()
    on_stopping = {version: PahoClient(stopping.process.tcp, unique(f"v{version}"),
                                       version=version) for version in (5, 4)}
    for client in on_stopping.values():
        clients.append(client)
        client.connect()

    publisher = Publisher(publisher_client, f"{topic}/x")
    publisher.start()
    wait_until(lambda: len(publisher.acknowledged) >= 20, 30, "20 acknowledged publishes")
    assert stopping.process.stop(timeout=30) == 0
    after_stop = len(publisher.acknowledged)
    wait_until(lambda: len(publisher.acknowledged) >= after_stop + 20, 30,
               "20 more acknowledged publishes")
    publisher.done.set()
    publisher.join(60)

    assert on_stopping[5].wait_disconnected(timeout=10) == SERVER_SHUTTING_DOWN
    assert on_stopping[4].wait_disconnected(timeout=10) != 0  # v3.1.1: closed, no reason
    for group in led:
        wait_until(lambda g=group: all(
            next(x for x in _groups(n) if x["id"] == g)["leader"] not in (None, shard0["leader"])
            for n in survivors), 30, f"group {group} led by a survivor")
        leader = sites[next(x for x in _groups(survivors[0]) if x["id"] == group)["leader"]]
        transfers, elections = before[(id(leader), group)]
        if graceful:  # elected on the old leader's TimeoutNow
            assert _transfer_elections(leader, group) == transfers + 1
        else:  # elected (on news of its closed links, without an election timeout)
            assert _transfer_elections(leader, group) == transfers
            assert _elections(leader, group) > elections
    log = stopping.process.log_text()
    assert (f"handed the leadership of {len(led)} Raft groups" in log) == graceful

    assert publisher.refused == []
    received = subscriber.wait_messages(len(publisher.acknowledged), timeout=60)
    assert sorted({int(m.payload) for m in received}) == publisher.acknowledged
