"""Status decisions and the plugin's rendering of them (no cluster needed)."""

import json
from typing import Any

from mqtt_operator import plugin, status


def pod(name: str, ready: bool, ip: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {
        "podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_pods_by_ordinal_ignore_foreign_names() -> None:
    views = status.pod_views([pod("mqc-0", True, "10.0.0.5"), pod("mqc-1", False),
                              pod("mqc-extra-2", True), pod("other-3", True)], "mqc")
    assert views == {0: status.PodView("mqc-0", True, "10.0.0.5"),
                     1: status.PodView("mqc-1", False, None)}
    listed = status.sites({0: "A", 1: "B", 2: "C"}, 2, views, "mqc")
    assert listed == [{"ordinal": 0, "id": "A", "pod": "mqc-0", "state": "up"},
                      {"ordinal": 1, "id": "B", "pod": "mqc-1", "state": "down"}]


def test_condition_keeps_its_transition_time_until_it_flips() -> None:
    first = status.condition([], "Ready", False, "NotReady", "0/3", "t1")
    same = status.condition([first], "Ready", False, "NotReady", "1/3", "t2")
    flipped = status.condition([same], "Ready", True, "AllSitesReady", "3/3", "t3")
    assert (first["lastTransitionTime"], same["lastTransitionTime"],
            flipped["lastTransitionTime"]) == ("t1", "t1", "t3")


def test_phase() -> None:
    assert status.phase(0, 3, False, False) == "Pending"
    assert status.phase(2, 3, False, False) == "Scaling"
    assert status.phase(3, 3, False, False) == "Running"
    assert status.phase(3, 3, True, False) == "Draining"
    assert status.phase(3, 3, False, True) == "Degraded"


BODY = {
    "metadata": {"name": "mqc", "namespace": "prod"},
    "status": {
        "sites": [{"ordinal": 0, "id": "AAAA", "pod": "mqc-0", "state": "up"},
                  {"ordinal": 1, "id": "BBBB", "pod": "mqc-1", "state": "down"}],
        "placement": {"revision": 2, "shards": {"0": ["AAAA", "BBBB"], "10": ["BBBB"]},
                      "loads": {"AAAA": 1, "BBBB": 2}},
        "transitions": [{"shard": 10, "add": ["BBBB"], "remove": ["CCCC"]}],
        "drain": {"sites": ["CCCC"], "from": 3, "to": 2, "message": "waiting"},
        "goneSites": ["DDDD"],
    },
}


def test_sites_reads_like_emqx_ds_info() -> None:
    assert plugin.render_sites(BODY) == (
        "SITES:\n"
        "AAAA  mqc-0  up\n"
        "BBBB  mqc-1  down\n"
        "\n"
        "SHARDS:\n"
        "Shard        Replicas\n"
        "messages/0   AAAA BBBB\n"
        "messages/10  BBBB\n"
        "\n"
        "REPLICA TRANSITIONS:\n"
        "Shard        Transitions\n"
        "messages/10  +BBBB -CCCC\n"
        "\n"
        "DRAINING: CCCC (3 -> 2): waiting\n"
        "\n"
        "GONE WITH THEIR VOLUMES (leaving the Durable Storage groups): DDDD\n")


def test_shards_and_json() -> None:
    text = plugin.render_shards(BODY)
    assert "REPLICAS PER SITE:\nSite  Replicas\nAAAA  1\nBBBB  2\n" in text
    document = json.loads(plugin.as_json(BODY, "shards"))
    assert document["placement"]["shards"]["10"] == ["BBBB"] and "sites" not in document
    assert json.loads(plugin.as_json(BODY, "sites"))["drain"]["to"] == 2


def test_nodes_reads_like_emqx_cluster_status() -> None:
    nodes = [{"node": "broker@mqc-0.h", "site": "AAAA", "node_status": "running",
              "version": "0.1.0", "uptime": 93_784_000, "connections": 12},
             {"node": "broker@mqc-1.h", "site": "BBBB", "node_status": "running",
              "version": "0.1.0", "uptime": 59_999, "connections": 0},
             {"node": "broker@mqc-2.h", "site": "CCCC", "node_status": "stopped",
              "version": None, "uptime": None, "connections": None}]
    assert plugin.render_nodes("mqc-1", nodes) == (
        "NODES (as mqc-1 sees them):\n"
        "NODE            SITE  STATUS   CONNECTIONS  UPTIME  VERSION\n"
        "broker@mqc-0.h  AAAA  running  12           1d2h    0.1.0\n"
        "broker@mqc-1.h  BBBB  running  0            59s     0.1.0\n"
        "broker@mqc-2.h  CCCC  stopped  -            -       -\n")


def test_no_status_yet_says_so() -> None:
    empty = {"metadata": {"name": "mqc", "namespace": "prod"}}
    assert "is the operator running" in plugin.render_sites(empty)
    assert "is the operator running" in plugin.render_shards(empty)


def test_status_patch_removes_what_the_new_status_no_longer_has() -> None:
    old = {"placement": {"loads": {"A": 2, "B": 2, "C": 2}, "revision": 1},
           "siteIds": {"0": "A"}, "kopf": {"x": 1}, "drain": {"sites": ["C"]}}
    new = {"placement": {"loads": {"A": 3, "B": 3}, "revision": 2}, "siteIds": {"0": "A"},
           "drain": None}
    assert status.merge_patch(old, new) == {
        "placement": {"loads": {"A": 3, "B": 3, "C": None}, "revision": 2},
        "siteIds": {"0": "A"}, "drain": None}
