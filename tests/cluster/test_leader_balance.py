"""Leaderships spread again by themselves (`durable_storage.raft.leader_balance_interval`):
a node of a 3-node `builtin_raft` cluster stopped gracefully hands every group it leads to
the others and, started again, leads none; within a few balancing rounds it leads its
share again, by transfers, with no election (a balancing round may come before the test
first looks, so what it leads right after the start is not asserted)."""

import urllib.request

from tests.cluster.conftest import Cluster, Node, http_json
from tests.cluster.test_replicated_ds import REPLICATED, _groups_led
from tests.integration.clients import wait_until

GROUPS = 1 + 1 + 4  # metadata, sessions, 4 shards


def _led(node: Node) -> int:
    return sum(group["role"] == "leader"
               for group in http_json(node.http, "/api/v5/raft")["groups"])


def _total(node: Node, metric: str) -> float:
    """A metric summed over its samples (one per Raft group)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http}/metrics", timeout=10) as got:
        lines = got.read().decode().splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(metric + "{"))


def test_a_restarted_node_gets_its_share_of_leaderships_back(cluster: Cluster) -> None:
    nodes = cluster.start(3, **REPLICATED,
                          **{"durable_storage.raft.leader_balance_interval": "1s"})
    cluster.all_running(nodes)
    _groups_led(nodes, GROUPS)
    Cluster.wait_version(nodes)
    restarted = nodes[0]
    assert restarted.process.stop() == 0  # SIGTERM: it hands its groups over first
    restarted.start()
    cluster.all_running(nodes)
    _groups_led(nodes, GROUPS)

    def spread() -> bool:
        counts = [_led(node) for node in nodes]
        return sum(counts) == GROUPS and max(counts) - min(counts) <= 1
    wait_until(spread, 30, "every node leading its share of the Raft groups")
    # Handed to it (TimeoutNow), not taken by elections after timeouts.
    assert _total(restarted, "raft_transfer_elections_total") >= _led(restarted) >= 1
