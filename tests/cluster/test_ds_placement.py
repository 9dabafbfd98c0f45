"""The operator's shard placement on real builtin_raft nodes: a site the placement lists as
leaving gives up every replica and then reports no shard (`GET /api/v5/ds/sites/{site}`,
what the operator's drain-before-shrink asks); the others keep accepting durable publishes."""

import json
import urllib.error
from pathlib import Path

import pytest

from tests.cluster.conftest import Cluster, Node, http_json
from tests.cluster.test_replicated_ds import REPLICATED, _client, _groups_led
from tests.integration.clients import PahoClient, run_cli, unique, wait_until

N_SHARDS = 4


def _held(node: Node, site: str) -> list[tuple[str, str]]:
    answer = http_json(node.http, f"/api/v5/ds/sites/{site}")
    return sorted((shard["storage"], shard["id"]) for shard in answer["shards"])


def durable_pair(clients: list[PahoClient], reading: Node, publishing: Node,
                 name: str) -> tuple[PahoClient, PahoClient, str]:
    """A durable subscriber (on `reading`) to a fresh topic and a publisher (on
    `publishing`), once `publishing` has applied the subscription from the replicated
    sessions database (before, it would store nothing for it): (subscriber, publisher,
    topic)."""
    known = publishing.metric("mqtt_durable_filters")
    subscriber = _client(clients, reading, unique("sub"))
    subscriber.connect(clean_start=False, session_expiry=3600)
    topic = unique(name).replace("-", "/")
    subscriber.subscribe(topic, qos=1)
    wait_until(lambda: publishing.metric("mqtt_durable_filters") > known, 10,
               "the durable subscription applied on the publisher's node")
    publisher = _client(clients, publishing, unique("pub"))
    publisher.connect()
    return subscriber, publisher, topic


def _write(path: Path, doc: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)  # as kubelet swaps a ConfigMap's file: atomically


def test_a_leaving_site_is_drained_and_reports_no_shard(
        cluster: Cluster, clients: list[PahoClient], tmp_path: Path) -> None:
    placement = tmp_path / "placement.json"
    nodes = cluster.start(3, **REPLICATED,
                          **{"durable_storage.messages.placement_file": str(placement)})
    cluster.all_running(nodes)
    _groups_led(nodes, 2 + N_SHARDS)
    sites = [http_json(node.http, "/api/v5/raft")["site"] for node in nodes]
    assert sorted(http_json(nodes[0].http, "/api/v5/ds/sites")) == sorted(sites)
    everything = sorted([("sessions", "0")] + [("messages", str(i)) for i in range(N_SHARDS)])
    wait_until(lambda: all(_held(nodes[0], site) == everything for site in sites), 20,
               "every site voting in every group (3 sites, replication factor 3)")

    # The operator's scale-down from 3 to 2: n3 leaves; upper-case, as the operator writes.
    keep = [site.upper() for site in sites[:2]]
    _write(placement, {"version": "v3", "db": "messages", "revision": 2,
                       "nShards": N_SHARDS, "replicationFactor": 3, "sites": keep,
                       "leaving": [sites[2].upper()],
                       "shards": {str(i): keep for i in range(N_SHARDS)}, "transitions": []})
    wait_until(lambda: _held(nodes[2], sites[2]) == [] and _held(nodes[0], sites[2]) == [],
               30, "the leaving site drained, as it and another node see it")
    for site in sites[:2]:
        assert _held(nodes[0], site) == everything
    for group in http_json(nodes[0].http, "/api/v5/raft")["groups"]:
        if group["name"] != "metadata":
            assert sites[2] not in group["voters"] + group["learners"], group
    shown = run_cli("ctl", "ds", "info", "--url", f"http://127.0.0.1:{nodes[0].http}")
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines()
            if line.strip() and line.split()[0] in sites}
    assert rows[sites[0]][2:] == ["yes", "0", "1", "2", "3"]
    assert rows[sites[2]][2:] == ["yes", "-"]

    # The two that stay are a majority of every group: durable publishes are acknowledged.
    subscriber, publisher, topic = durable_pair(clients, nodes[0], nodes[1], "drained")
    assert publisher.publish(topic, b"after the drain", qos=1) == 0
    assert subscriber.wait_messages(1)[0].payload == b"after the drain"


def test_a_placement_for_another_shard_count_is_not_followed(
        cluster: Cluster, tmp_path: Path) -> None:
    placement = tmp_path / "placement.json"
    _write(placement, {"db": "messages", "revision": 1, "nShards": 16, "shards": {},
                       "leaving": []})
    nodes = cluster.start(1, **{
        **REPLICATED, "durable_storage.n_sites": "1",
        "durable_storage.messages.placement_file": str(placement)})
    cluster.all_running(nodes)
    wait_until(lambda: "not followed" in nodes[0].process.log_text(), 10,
               "the placement refused in the log")
    assert "n_shards 4" in nodes[0].process.log_text()
    with pytest.raises(urllib.error.HTTPError) as refused:
        http_json(nodes[0].http, "/api/v5/ds/sites/nosuchsite")
    assert refused.value.code == 404
