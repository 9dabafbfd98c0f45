"""Failover across real broker processes: a leader killed with -9 is replaced as soon as its
peers see its connections close, long before an election timeout; a frozen one (SIGSTOP:
its connections stay open, it only falls silent) is not replaced before the election
timeout. The election timeout is long here, so that the two cannot be mistaken for each
other: each test compares with half of it, a wide margin either way (a kill's election
takes a few tenths of a second even on a loaded machine, a freeze's one at least the
timeout)."""

import os
import signal
import time

from tests.cluster.conftest import Cluster, Node, http_json
from tests.integration.clients import PahoClient, unique, wait_until

ELECTION_TIMEOUT = 6.0
SETTINGS = {"durable_storage.messages.backend": "builtin_raft",
            "durable_storage.n_sites": "3", "durable_storage.messages.n_shards": "2",
            "durable_storage.raft.election_timeout": f"{ELECTION_TIMEOUT:g}s"}
GROUPS = 1 + 1 + 2  # metadata, sessions, 2 shards


def _groups(node: Node) -> dict[int, dict[str, object]]:
    return {g["id"]: g for g in http_json(node.http, "/api/v5/raft")["groups"]}


def _started(cluster: Cluster) -> tuple[list[Node], dict[str, Node]]:
    nodes = cluster.start(3, **SETTINGS)
    cluster.all_running(nodes)
    wait_until(lambda: all(len(_groups(n)) == GROUPS and all(
        g["leader"] for g in _groups(n).values()) for n in nodes),
        6 * ELECTION_TIMEOUT, "every group led, on every node")
    return nodes, {http_json(node.http, "/api/v5/raft")["site"]: node for node in nodes}


def _victim(nodes: list[Node], sites: dict[str, Node]) -> tuple[Node, str, list[int]]:
    """The metadata group's leader, its site and the groups it leads."""
    site = str(_groups(nodes[0])[0]["leader"])
    victim = sites[site]
    return victim, site, [g for g, x in _groups(victim).items() if x["role"] == "leader"]


def _replaced(survivors: list[Node], groups: list[int], old: str) -> bool:
    """Every survivor sees another leader than `old` (or none: an election) in `groups`."""
    return all(_groups(node)[group]["leader"] != old for node in survivors for group in groups)


def _led_elsewhere(survivors: list[Node], groups: list[int], old: str) -> bool:
    return all(_groups(node)[group]["leader"] not in (None, old)
               for node in survivors for group in groups)


def test_a_killed_leader_is_replaced_long_before_an_election_timeout(cluster: Cluster,
                                                                      clients: list[PahoClient],
                                                                      ) -> None:
    nodes, sites = _started(cluster)
    victim, site, led = _victim(nodes, sites)
    survivors = [node for node in nodes if node is not victim]
    elections = {(id(n), g): n.metric("raft_elections_total", group=str(g))
                 for n in survivors for g in led}
    killed = time.monotonic()
    victim.process.kill()
    wait_until(lambda: _led_elsewhere(survivors, led, site), 4 * ELECTION_TIMEOUT,
               "a survivor leading every group the killed node led")
    took = time.monotonic() - killed
    assert took < ELECTION_TIMEOUT / 2, f"new leaders after {took:.2f} s"
    # Elected (not handed over), on news of the closed links.
    assert any(n.metric("raft_elections_total", group=str(g)) > elections[id(n), g]
               for n in survivors for g in led)
    assert all("(it closed the link)" in node.process.log_text() for node in survivors)
    # The cluster takes durable writes again: a QoS 1 PUBLISH a persistent session holds.
    topic = unique("failover").replace("-", "/")
    subscriber = PahoClient(survivors[0].process.tcp, unique("sub"))
    clients.append(subscriber)
    subscriber.connect(clean_start=False, session_expiry=3600)
    subscriber.subscribe(topic, qos=1)
    publisher = PahoClient(survivors[1].process.tcp, unique("pub"))
    clients.append(publisher)
    publisher.connect()
    assert publisher.publish(topic, b"after the kill", qos=1, timeout=30) == 0
    assert [m.payload for m in subscriber.wait_messages(1, timeout=30)] == [b"after the kill"]


def test_a_frozen_leader_is_not_replaced_before_an_election_timeout(cluster: Cluster) -> None:
    nodes, sites = _started(cluster)
    victim, site, led = _victim(nodes, sites)
    survivors = [node for node in nodes if node is not victim]
    os.kill(victim.pid, signal.SIGSTOP)  # (the fixture sends SIGCONT before it kills)
    frozen = time.monotonic()
    # Its links go silent, and are closed by the survivors after node.dist_net_ticktime
    # (2 s): that is no news of a crash, the groups wait for their election timeout.
    wait_until(lambda: _replaced(survivors, led, site), 6 * ELECTION_TIMEOUT,
               "the survivors giving up the frozen leader")
    took = time.monotonic() - frozen
    assert took > ELECTION_TIMEOUT / 2, f"gave the frozen leader up after {took:.2f} s"
    assert not any("(it closed the link)" in node.process.log_text() for node in survivors)
    wait_until(lambda: _led_elsewhere(survivors, led, site), 6 * ELECTION_TIMEOUT,
               "a survivor leading every group the frozen node led")
