"""Membership on real processes: static seeds, failure detection, rejoin, refusals."""

import os
import signal
import socket
import subprocess
import sys
import urllib.error

import pytest

from tests.cluster.conftest import Cluster, Node, http_json
from tests.integration.clients import wait_until


def test_three_nodes_from_static_seeds_agree_on_one_member_list(cluster: Cluster) -> None:
    nodes = cluster.start(3)
    cluster.all_running(nodes)
    listed = http_json(nodes[0].http, "/api/v5/nodes")
    assert sorted(entry["node"] for entry in listed) == sorted(n.node_name for n in nodes)
    assert {entry["node_status"] for entry in listed} == {"running"}
    assert all(isinstance(entry["uptime"], int) for entry in listed)
    sites = {entry["site"] for entry in listed}
    assert len(sites) == 3
    one = http_json(nodes[2].http, f"/api/v5/nodes/{nodes[1].node_name}")
    assert one["node"] == nodes[1].node_name and one["node_status"] == "running"


def test_killed_node_is_declared_down_then_rejoins_by_itself(cluster: Cluster) -> None:
    nodes = cluster.start(3)
    cluster.all_running(nodes)
    victim = nodes[2]
    site = http_json(victim.http, "/api/v5/cluster")["nodes"][0]["site"]
    victim.process.kill()
    cluster.wait_statuses(nodes[:2], {victim.node_name: "stopped"}, timeout=10)
    victim.start()  # same data dir: same site, rejoins from its seeds
    cluster.all_running(nodes)
    after = http_json(nodes[0].http, "/api/v5/cluster")["nodes"]
    assert [e["site"] for e in after if e["node"] == victim.node_name] == [site]
    assert nodes[0].metric("mqtt_cluster_link_ups_total", peer=victim.node_name) >= 2


def test_frozen_node_is_declared_down_and_rejoins_when_thawed(cluster: Cluster) -> None:
    nodes = cluster.start(3)
    cluster.all_running(nodes)
    frozen = nodes[1]
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        # node.dist_net_ticktime is 2 s in these tests: down well within 10 s.
        cluster.wait_statuses([nodes[0], nodes[2]], {frozen.node_name: "stopped"}, timeout=10)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    cluster.all_running(nodes)
    listed = http_json(nodes[0].http, "/api/v5/cluster")["nodes"]
    assert len(listed) == 3  # no duplicate entry for the thawed node


def test_wrong_cookie_or_cluster_name_cannot_join(cluster: Cluster) -> None:
    nodes = cluster.start(2)
    cluster.all_running(nodes)
    (intruder,) = cluster.make(1)
    intruder.settings["node.cookie"] = "not-the-cookie"
    intruder.start()
    (stranger,) = cluster.make(1)
    stranger.settings["cluster.name"] = "other"
    stranger.start()

    def refused() -> bool:
        return (nodes[0].metric("mqtt_cluster_peers_refused_total", reason="bad cookie") > 0
                and nodes[0].metric("mqtt_cluster_peers_refused_total",
                                    reason="cluster name mismatch") > 0)

    wait_until(refused, 20, "both refusals counted")
    for node in nodes:
        assert set(node.statuses()) == {n.node_name for n in nodes}
    assert set(intruder.statuses()) == {intruder.node_name}
    assert any("refused" in line for line in nodes[0].process.log_lines)


def test_force_leave_removes_a_node_until_it_joins_again(cluster: Cluster) -> None:
    nodes = cluster.start(3)
    cluster.all_running(nodes)
    removed = nodes[2]
    http_json(nodes[0].http, f"/api/v5/cluster/{removed.node_name}/force_leave", "DELETE")
    wait_until(lambda: set(nodes[1].statuses()) == {nodes[0].node_name, nodes[1].node_name},
               10, "the removed node gone from the others")
    wait_until(lambda: set(removed.statuses()) == {removed.node_name}, 10,
               "the removed node alone")
    assert nodes[0].metric("mqtt_cluster_members", status="running") == 2
    http_json(removed.http, "/api/v5/cluster/join", "POST", {"node": nodes[0].seed})
    cluster.all_running(nodes)


def test_broker_ctl_cluster_status_and_force_leave(cluster: Cluster) -> None:
    nodes = cluster.start(2)
    cluster.all_running(nodes)
    url = f"--url=http://127.0.0.1:{nodes[0].http}"
    shown = subprocess.run([sys.executable, "-m", "broker", "ctl", "cluster", "status", url],
                           capture_output=True, text=True, check=True).stdout
    assert f"{nodes[0].node_name} (this node)" in shown
    assert nodes[1].node_name in shown and "running" in shown
    nodes[1].process.kill()
    cluster.wait_statuses([nodes[0]], {nodes[1].node_name: "stopped"}, timeout=10)
    out = subprocess.run([sys.executable, "-m", "broker", "ctl", "cluster", "force-leave",
                          nodes[1].node_name, url], capture_output=True, text=True, check=True)
    assert nodes[1].node_name not in out.stdout
    missing = subprocess.run([sys.executable, "-m", "broker", "ctl", "cluster", "force-leave",
                              "nobody@nowhere", url], capture_output=True, text=True)
    assert missing.returncode == 1 and "no member" in missing.stderr


def test_ready_once_every_seed_was_tried_and_a_silent_seed_only_delays_it(
        cluster: Cluster) -> None:
    """Readiness means joined: a node answers 503 on /api/v5/ready until its first discovery
    round has linked or given up on every seed; a seed that accepts TCP and never answers
    the handshake is closed after node.dist_net_ticktime, never keeps the node unready."""
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        first, second = cluster.make(2)
        silent_seed = f"mute@127.0.0.1:{silent.getsockname()[1]}"
        for node in (first, second):
            node.settings["cluster.static.seeds"] += "," + silent_seed
        first.start()
        accepted, _ = silent.accept()  # the node dialled it: not ready while it waits
        with pytest.raises(urllib.error.HTTPError) as refused:
            http_json(first.http, "/api/v5/ready")
        assert refused.value.code == 503
        wait_until(lambda: _ready(first), 15, "ready after the silent seed timed out")
        second.start()
        wait_until(lambda: _ready(second), 15, "second node ready")
        assert http_json(second.http, "/api/v5/ready")["peers"] == 1
        accepted.close()
    finally:
        silent.close()


def _ready(node: Node) -> bool:
    try:
        return bool(http_json(node.http, "/api/v5/ready")["joined"])
    except urllib.error.HTTPError:
        return False
