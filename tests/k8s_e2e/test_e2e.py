"""End to end on the test bed's node (`make test-k8s-e2e`): the chart installed with three
replicas, brokers joined through k8s discovery, clients meeting across pods, a scale to five
and back whose drain live brokers confirm without losing an acknowledged message, a
deleted pod that comes back with its site ID and its volume, and one whose volume was lost
that comes back as a new site."""

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import Testbed, event_reasons, eventually
from tests.k8s_e2e.cluster import (
    api_key,
    ask,
    describe,
    install,
    mosquitto,
    scale,
    service_ip,
    wait_brokers,
)
from tests.k8s_e2e.prometheus import prometheus, query, selected_targets

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

# These tests are about clustering, not who may connect (test_short.py): their clients
# stay anonymous.
CLUSTER = ("cluster.replicas=3", "cluster.auth.allowAnonymous=true")
WATCHER = ("-i", "watcher", "-c", "-x", "3600", "-q", "1", "-t", "e2e/#")


def node_name(pod: dict) -> str:
    meta = pod["metadata"]
    return f"broker@{meta['name']}.mq-headless.{meta['namespace']}.svc"


def watch(node: Testbed, namespace: str, host: str) -> None:
    """The durable session `watcher` subscribes to e2e/# through the Service, and leaves.
    Its first CONNACK waits for the sessions' Raft group; once it took over 60 s."""
    try:
        mosquitto("mosquitto_sub", host, *WATCHER, "-E", timeout=120)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"{error}\n{describe(node, namespace)}") from error


def settled(node: Testbed, namespace: str, name: str, replicas: int) -> bool:
    status = node.get("mqttcluster", name, namespace).get("status", {})
    return status.get("readyReplicas") == replicas and not status.get("transitions")


def test_three_pods_join_meet_across_pods_and_a_deleted_one_returns_as_itself(
        node: Testbed, release: tuple[str, str]) -> None:
    namespace, name = release
    install(node, namespace, name, *CLUSTER)
    pods = wait_brokers(node, namespace, name, 3)
    # Ready means joined; a durable session also wants its Raft groups placed.
    eventually(lambda: settled(node, namespace, name, 3), timeout=180,
               what="replica transitions settled")
    key = api_key(node, namespace, name)
    everyone = sorted(node_name(p) for p in pods)
    for pod in pods:  # every broker sees all three running (Ready: it tried to join them)
        eventually(lambda pod=pod: sorted(
            m["node"] for m in ask(pod, "/api/v5/nodes", key)
            if m["node_status"] == "running") == everyone, timeout=60,
            what=f"{pod['metadata']['name']} seeing all three running")

    # A durable session through the Service; one QoS 1 message published on each pod.
    host = service_ip(node, namespace, name)
    watch(node, namespace, host)
    for pod in pods:
        mosquitto("mosquitto_pub", pod["status"]["podIP"], "-q", "1", "-t",
                  f"e2e/{pod['metadata']['name']}", "-m", pod["metadata"]["name"])
    got = mosquitto("mosquitto_sub", host, *WATCHER, "-C", "3", "-W", "60", timeout=90)
    assert sorted(got.split()) == sorted(p["metadata"]["name"] for p in pods)

    # Live routing: a subscriber on pod 0, a publisher on pod 1, until they meet.
    first, second = pods[0]["status"]["podIP"], pods[1]["status"]["podIP"]
    with subprocess.Popen(["mosquitto_sub", "-h", first, "-t", "live/x", "-C", "1", "-W", "60"],
                          stdout=subprocess.PIPE, text=True) as sub:
        try:
            deadline = time.monotonic() + 60
            while sub.poll() is None and time.monotonic() < deadline:
                mosquitto("mosquitto_pub", second, "-t", "live/x", "-m", "across")
                time.sleep(0.5)
        finally:
            sub.kill() if sub.poll() is None else None
        assert sub.stdout is not None and sub.stdout.read().strip() == "across"

    # A deleted pod comes back with its site ID, its claim and what its volume held.
    victim = pods[1]
    site = next(m["site"] for m in ask(victim, "/api/v5/nodes", key)
                if m["node"] == node_name(victim))
    node.kubectl("exec", "-n", namespace, victim["metadata"]["name"], "--", "sh", "-c",
                 "echo before > /data/e2e-marker")
    claim = node.get("pvc", f"data-{victim['metadata']['name']}", namespace)["metadata"]["uid"]
    node.kubectl("delete", "pod", "-n", namespace, victim["metadata"]["name"])
    back = eventually(lambda: [p for p in wait_brokers(node, namespace, name, 3)
                               if p["metadata"]["name"] == victim["metadata"]["name"]
                               and p["metadata"]["uid"] != victim["metadata"]["uid"]],
                      timeout=180, what="the deleted pod back")[0]
    assert next(m["site"] for m in ask(back, "/api/v5/nodes", key)
                if m["node"] == node_name(back)) == site
    assert node.kubectl("exec", "-n", namespace, back["metadata"]["name"], "--", "cat",
                        "/data/e2e-marker").stdout.strip() == "before"
    assert node.get("pvc", f"data-{back['metadata']['name']}", namespace)[
        "metadata"]["uid"] == claim


def test_a_pod_whose_volume_was_lost_comes_back_as_a_new_site_and_serves(
        node: Testbed, release: tuple[str, str]) -> None:
    """Its old site would be refused (`reborn`): the operator names a new one for the new
    claim, which the pod takes on its empty volume, joins with, and serves from."""
    namespace, name = release
    install(node, namespace, name, *CLUSTER)
    pods = wait_brokers(node, namespace, name, 3)
    key = api_key(node, namespace, name)
    victim = pods[2]["metadata"]["name"]
    old_site = node.get("mqttcluster", name, namespace)["status"]["siteIds"]["2"]
    node.kubectl("delete", "pvc", f"data-{victim}", "-n", namespace, "--wait=false")
    node.kubectl("delete", "pod", victim, "-n", namespace)
    back = eventually(lambda: [p for p in wait_brokers(node, namespace, name, 3)
                               if p["metadata"]["name"] == victim
                               and p["metadata"]["uid"] != pods[2]["metadata"]["uid"]],
                      timeout=240, what="the pod back on a new volume")[0]
    new_site = node.get("mqttcluster", name, namespace)["status"]["siteIds"]["2"]
    assert new_site != old_site
    assert next(m["site"] for m in ask(back, "/api/v5/nodes", key)
                if m["node"] == node_name(back)) == new_site
    mosquitto("mosquitto_pub", back["status"]["podIP"], "-q", "1", "-r", "-t", "e2e/new",
              "-m", "on a new site")
    assert mosquitto("mosquitto_sub", back["status"]["podIP"], "-t", "e2e/new", "-C", "1",
                     "-W", "30").strip() == "on a new site"


def test_prometheus_scrapes_every_pod_the_service_monitor_selects(
        node: Testbed, release: tuple[str, str], tmp_path: Path) -> None:
    namespace, name = release
    install(node, namespace, name, *CLUSTER)
    pods = wait_brokers(node, namespace, name, 3)
    monitor = node.get("servicemonitor", name, namespace)
    targets = selected_targets(node, monitor)
    assert targets == sorted(f"{p['status']['podIP']}:18083" for p in pods)
    with prometheus(monitor, targets, tmp_path) as port:
        def three_up() -> list[dict[str, Any]] | None:
            found = query(port, "up == 1")
            return found if len(found) == 3 else None
        up = eventually(three_up, timeout=60, what="three broker targets up")
    assert sorted(r["metric"]["instance"] for r in up) == sorted(
        f"{p['status']['podIP']}:18083" for p in pods)


def test_scale_to_five_and_back_drains_and_loses_no_acknowledged_message(
        node: Testbed, release: tuple[str, str]) -> None:
    namespace, name = release
    install(node, namespace, name, *CLUSTER)
    wait_brokers(node, namespace, name, 3)
    eventually(lambda: settled(node, namespace, name, 3), timeout=180,
               what="replica transitions settled")
    host = service_ip(node, namespace, name)
    watch(node, namespace, host)
    # mosquitto_pub exits 0 only once every QoS 1 message is acknowledged.
    mosquitto("mosquitto_pub", host, "-q", "1", "-t", "e2e/a", "-l",
              stdin="".join(f"a{i}\n" for i in range(100)))

    scale(node, namespace, name, 5)
    wait_brokers(node, namespace, name, 5)
    mosquitto("mosquitto_pub", host, "-q", "1", "-t", "e2e/b", "-l",
              stdin="".join(f"b{i}\n" for i in range(100)))

    # Settled first: the drain then moves only what the scale up placed (a scale back while
    # transitions are pending is tests/k8s' test_a_spec_edited_back_while_...).
    eventually(lambda: settled(node, namespace, name, 5), timeout=180,
               what="replica transitions settled on five pods")
    scale(node, namespace, name, 3)
    try:
        eventually(lambda: "ScaledDown" in event_reasons(node, namespace, name), timeout=300,
                   what="the operator's scale down")
    except AssertionError as error:
        status = node.get("mqttcluster", name, namespace).get("status", {})
        raise AssertionError(f"{error}\ndrain: {status.get('drain')}\n"
                             f"{describe(node, namespace)}") from error
    reasons = event_reasons(node, namespace, name)
    assert "DrainConfirmed" in reasons and "DrainUnconfirmed" not in reasons, reasons
    wait_brokers(node, namespace, name, 3)
    got = mosquitto("mosquitto_sub", host, *WATCHER, "-C", "200", "-W", "90", timeout=120)
    assert sorted(got.split()) == sorted([f"a{i}" for i in range(100)]
                                         + [f"b{i}" for i in range(100)])
