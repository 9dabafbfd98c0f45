"""`kubectl mqtt clients | sessions | generations` through the real kubectl, the test bed's
API server and its pod proxy, against two real broker processes clustered with replicated
Durable Storage and the API keys of the operator's Secret, as pods would run them."""

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import Cluster, Node, http_json
from tests.integration.clients import PahoClient, unique
from tests.k8s.conftest import (
    Testbed,
    eventually,
    pod_ip,
    set_pod_ready,
)
from tests.k8s.test_plugin import mqtt, two_pod_brokers

REPLICATED = {"durable_storage.messages.backend": "builtin_raft", "durable_storage.n_sites": "2",
              "durable_storage.messages.n_shards": "2",
              "durable_storage.messages.replication_factor": "2"}


def table(testbed: Testbed, namespace: str, verb: str) -> tuple[list[str], list[list[str]]]:
    """(the lines before the header, each row's cells) of a verb's text output."""
    done = mqtt(testbed, verb, "web", "-n", namespace)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] in (
        ["CLIENT", "ID"], ["SHARD", "GENERATION"]))
    return lines[:header], [line.split() for line in lines[header + 1:]]


def as_json(testbed: Testbed, namespace: str, verb: str) -> dict[str, Any]:
    done = mqtt(testbed, verb, "web", "-n", namespace, "-o", "json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.fixture
def web(testbed: Testbed, namespace: str, operator: Callable[[], Any],
        tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    """MQTTCluster `web` of two pods: web-0 is broker n1 at pod IP .2, web-1 is n2 at pod
    IP .1, both Ready, reached through the pod proxy; the operator is stopped again once
    it has made the Secret and the pods."""
    brokers = Cluster(tmp_path)
    try:
        with operator():
            _, n1, n2 = two_pod_brokers(testbed, namespace, brokers, **REPLICATED)
            for node in (n1, n2):
                node.start()
            brokers.all_running([n1, n2])
            for pod, host in (("web-0", 2), ("web-1", 1)):
                eventually(lambda p=pod: testbed.find("pod", p, namespace), what=pod)
                set_pod_ready(testbed, namespace, pod, pod_ip(host))
            eventually(lambda: [s["state"] for s in testbed.get("mqc", "web", namespace)[
                "status"]["sites"]] == ["up", "up"], what="both sites up")
        yield n1, n2
    finally:
        brokers.stop_all()


def test_clients_sessions_and_generations_through_the_pod_proxy(
        testbed: Testbed, namespace: str, web: tuple[Node, Node], tmp_path: Path,
        clients: list[PahoClient]) -> None:
    n1, n2 = web
    away, live = unique("away"), unique("live")
    topic = unique("plug").replace("-", "/")
    durable = PahoClient(n1.process.tcp, away)
    clients.append(durable)
    durable.connect(clean_start=False, session_expiry=3600)
    durable.subscribe(f"{topic}/#", qos=1)
    durable.disconnect()
    publisher = PahoClient(n2.process.tcp, live)
    clients.append(publisher)
    publisher.connect()
    eventually(lambda: n2.metric("mqtt_durable_filters") >= 1, what="the filter on n2")
    for i in range(3):
        assert publisher.publish(f"{topic}/{i}", b"m", qos=1) == 0

    # clients: one broker answers for both nodes, the ready pod first (web-0, by ordinal).
    first, rows = table(testbed, namespace, "clients")
    assert first == ["CLIENTS (as web-0 sees them):"]
    assert {row[0]: row[1:5] for row in rows} == {
        away: [n1.node_name, "disconnected", "-", "yes"],
        live: [n2.node_name, "connected", "5.0", "no"]}
    document = as_json(testbed, namespace, "clients")
    assert document["pod"] == "web-0" and document["clients"]["meta"]["count"] == 2

    # sessions: every broker for its own durable sessions; the away one misses three.
    missed = eventually(lambda: (r := table(testbed, namespace, "sessions")[1]) and r[0][-1]
                        == "3" and r, what="three messages missed by the away session")
    assert [row[:3] for row in missed] == [[away, n1.node_name, "disconnected"]]
    assert missed[0][3].startswith("59m")  # EXPIRES IN, by the broker's clock
    sessions = as_json(testbed, namespace, "sessions")
    assert [s["clientid"] for s in sessions["sessions"]] == [away]
    assert sessions["unanswered"] == []

    # generations: both replicas hold both shards; a seal shows as a sealed generation.
    admin = next(line.rsplit(":", 1)[0] for line in (tmp_path / "api_keys").read_text()
                 .splitlines() if line.endswith(":administrator"))
    sealed = http_json(n1.http, "/api/v5/ds/storages/messages/generations", "POST", {},
                       api_key=admin)["sealed"]  # how many shards had data to seal
    assert sealed >= 1
    generations = eventually(lambda: (g := as_json(testbed, namespace, "generations")[
        "generations"]) and sum(e["state"] == "sealed" for e in g) == sealed and g,
        what="the sealed generations on both replicas")
    assert {e["pods"] == ["web-0", "web-1"] for e in generations} == {True}
    assert sum(e["messages"] for e in generations if e["state"] == "sealed") == 3
    _, rows = table(testbed, namespace, "generations")
    sealed_row = next(row for row in rows if row[2] == "sealed")
    until = datetime.strptime(sealed_row[4], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - until).total_seconds()) < 120
    assert sealed_row[-2:] == ["web-0", "web-1"]

    # A broker gone: what the others answer is listed, and the silent pod named.
    n2.process.kill()
    partial = mqtt(testbed, "sessions", "web", "-n", namespace)
    assert partial.returncode == 0, partial.stderr
    assert away in partial.stdout
    assert partial.stderr.startswith("warning: not listed: web-1: ")
    n1.process.kill()
    none = mqtt(testbed, "generations", "web", "-n", namespace)
    assert none.returncode == 1
    assert none.stderr.startswith(
        "error: no broker answered GET /api/v5/ds/storages: web-0: ")
