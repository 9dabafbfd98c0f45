"""`kubectl mqtt` run through the real kubectl (plugin found on PATH) against the test bed.

`nodes` reaches real broker processes the way it would in a cluster: through the API
server's pod proxy (and the test bed's PodNetwork standing in for the pod network), with
the viewer key of the cluster's API key Secret, which the brokers' bootstrap file holds."""

import base64
import json
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster.conftest import Cluster, Node, http_json
from tests.k8s.conftest import (
    Testbed,
    api_key_of,
    cluster_manifest,
    eventually,
    pod_ip,
    service_account_kubeconfig,
    set_pod_ready,
)


def mqtt(testbed: Testbed, *args: str, kubeconfig: Path | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = {"KUBECONFIG": str(kubeconfig)} if kubeconfig else None
    return testbed.kubectl("mqtt", *args, check=False, env=env)


def test_sites_and_shards_text_and_json(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    with operator():
        testbed.apply(cluster_manifest("web", replicas=3, durableStorage={"nShards": 4}),
                      namespace)
        status = eventually(lambda: testbed.get("mqc", "web", namespace).get("status", {}).get(
            "placement") and testbed.get("mqc", "web", namespace)["status"])
        ids = [status["siteIds"][str(o)] for o in range(3)]
        eventually(lambda: testbed.find("pod", "web-1", namespace))
        set_pod_ready(testbed, namespace, "web-1")
        eventually(lambda: [s["state"] for s in testbed.get("mqc", "web", namespace)[
            "status"]["sites"]] == ["down", "up", "down"])

    text = mqtt(testbed, "sites", "web", "-n", namespace)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "SITES:"
    assert lines[1].split() == [ids[0], "web-0", "down"]
    assert lines[2].split() == [ids[1], "web-1", "up"]
    assert "SHARDS:" in lines and "REPLICA TRANSITIONS:" in lines
    shard_rows = [line.split() for line in lines if line.startswith("messages/")]
    assert [row[0] for row in shard_rows][:4] == [f"messages/{n}" for n in range(4)]
    assert all(len(row) == 4 and set(row[1:]) == set(ids) for row in shard_rows[:4])

    as_json = json.loads(mqtt(testbed, "sites", "web", "-o", "json", "-n", namespace).stdout)
    assert [s["id"] for s in as_json["sites"]] == ids
    assert as_json["namespace"] == namespace and as_json["drain"] is None

    shards = mqtt(testbed, "shards", "web", "-n", namespace, "-o", "json")
    document = json.loads(shards.stdout)
    assert sorted(document["placement"]["shards"], key=int) == ["0", "1", "2", "3"]
    assert document["placement"]["loads"] == dict.fromkeys(ids, 4)
    shards_text = mqtt(testbed, "shards", "web", "-n", namespace).stdout
    assert "REPLICAS PER SITE:" in shards_text and f"{ids[2]}  4" in shards_text


def test_missing_cluster_and_no_access_are_clear_errors(
        testbed: Testbed, namespace: str, tmp_path: Path) -> None:
    missing = mqtt(testbed, "sites", "nope", "-n", namespace)
    assert missing.returncode == 1
    assert f'MQTTCluster "nope" not found in namespace "{namespace}"' in missing.stderr
    default_ns = mqtt(testbed, "shards", "nope")  # the kubeconfig context's namespace
    assert 'not found in namespace "default"' in default_ns.stderr

    testbed.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    kubeconfig = service_account_kubeconfig(testbed, namespace, "nobody",
                                            tmp_path / "nobody.kubeconfig")
    denied = mqtt(testbed, "sites", "web", "-n", namespace, kubeconfig=kubeconfig)
    assert denied.returncode == 1
    assert "no access to MQTTCluster" in denied.stderr and "403" in denied.stderr


def free_port_on(*hosts: str) -> int:
    """One port free on every one of these loopback addresses: every pod of a cluster
    listens on the same HTTP port, each on its own address."""
    while True:
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = int(probe.getsockname()[1])
            try:
                for host in hosts[1:]:
                    with socket.socket() as other:
                        other.bind((host, port))
            except OSError:
                continue
            return port


def two_pod_brokers(testbed: Testbed, namespace: str, brokers: Cluster, **settings: str
                    ) -> tuple[int, Node, Node]:
    """(HTTP port, n1, n2) for MQTTCluster `web` of two pods, applied here: web-0 is n1 at
    pod IP .2, web-1 is n2 at pod IP .1, both with the bootstrap file of the operator's API
    key Secret and its viewer key (not started). The operator must be running."""
    port = free_port_on("127.0.0.1", "127.0.0.2")
    testbed.apply(cluster_manifest("web", replicas=2, listeners={"httpPort": port},
                                   durableStorage={"replicationFactor": 2}), namespace)
    secret = eventually(lambda: testbed.find("secret", "web-api-key", namespace))
    keys = brokers.tmp_path / "api_keys"  # what the pods mount
    keys.write_text(base64.b64decode(secret["data"]["api_keys"]).decode())
    n1, n2 = brokers.make(2, **settings, **{"api_key.bootstrap_file": str(keys)})
    for node, host in ((n1, "127.0.0.2"), (n2, "127.0.0.1")):
        node.settings["dashboard.listeners.http.bind"] = f"{host}:{port}"
        node.api_key = api_key_of(testbed, namespace, "web")
    return port, n1, n2


def nodes_table(testbed: Testbed, namespace: str) -> tuple[str, dict[str, list[str]]]:
    """(the first line, node -> its row's other cells) of `kubectl mqtt nodes`."""
    done = mqtt(testbed, "nodes", "web", "-n", namespace)
    assert done.returncode == 0, done.stderr
    first, header, *rows = done.stdout.splitlines()
    assert header.split() == ["NODE", "SITE", "STATUS", "CONNECTIONS", "UPTIME", "VERSION"]
    return first, {row.split()[0]: row.split()[1:] for row in rows}


def test_nodes_asks_a_broker_through_the_pod_proxy_ready_pods_first(
        testbed: Testbed, namespace: str, operator: Callable[[], Any], tmp_path: Path) -> None:
    brokers = Cluster(tmp_path)
    try:
        with operator():
            port, n1, n2 = two_pod_brokers(testbed, namespace, brokers)
            # web-1 (ready) is n2 at pod IP .1, web-0 (running, not ready) is n1 at pod IP .2
            key = api_key_of(testbed, namespace, "web")
            for node in (n1, n2):
                node.start()
            brokers.wait_statuses([n2], {n1.node_name: "running", n2.node_name: "running"})
            sites = {node["node"]: node["site"]
                     for node in http_json(port, "/api/v5/cluster", api_key=key)["nodes"]}
            for pod in ("web-0", "web-1"):
                eventually(lambda p=pod: testbed.find("pod", p, namespace), what=pod)
            set_pod_ready(testbed, namespace, "web-0", pod_ip(2), ready=False)
            set_pod_ready(testbed, namespace, "web-1", pod_ip(1))
            eventually(lambda: [s["state"] for s in testbed.get("mqc", "web", namespace)[
                "status"]["sites"]] == ["down", "up"])

        first, rows = nodes_table(testbed, namespace)
        assert first == "NODES (as web-1 sees them):"  # the ready pod, though web-0 answers
        assert list(rows) == [n2.node_name, n1.node_name]  # the answering node first
        for node, (site, state, connections, _uptime, version) in rows.items():
            assert (site, state, connections) == (sites[node], "running", "0")
            assert version not in ("", "-")
        document = json.loads(mqtt(testbed, "nodes", "web", "-n", namespace, "-o", "json")
                              .stdout)
        assert document["pod"] == "web-1"
        assert {n["node"]: n["site"] for n in document["nodes"]} == sites

        # A key the brokers do not know: their 401, told apart from the API server's.
        testbed.kubectl("patch", "secret", "web-api-key", "-n", namespace, "--type=merge",
                        "-p", '{"stringData": {"password": "not-the-key"}}')
        refused = mqtt(testbed, "nodes", "web", "-n", namespace)
        assert refused.returncode == 1
        assert refused.stderr.startswith("error: no broker answered GET /api/v5/nodes: web-1:"
                                         " 401 Check api_key/api_secret; web-0: 401 ")
        testbed.kubectl("patch", "secret", "web-api-key", "-n", namespace, "--type=merge",
                        "-p", json.dumps({"stringData": {"password": key.split(":")[1]}}))

        n2.process.kill()  # web-1's broker is gone: web-0's answers, and sees n2 stopped
        first, rows = eventually(lambda: (t := nodes_table(testbed, namespace))[1].get(
            n2.node_name, ["", ""])[1] == "stopped" and t, what="n2 stopped, as n1 sees it")
        assert first == "NODES (as web-0 sees them):"
        assert rows[n2.node_name] == [sites[n2.node_name], "stopped", "-", "-", "-"]

        n1.process.kill()
        none = mqtt(testbed, "nodes", "web", "-n", namespace)
        assert none.returncode == 1
        assert none.stderr.startswith("error: no broker answered GET /api/v5/nodes: web-1: ")
        assert "; web-0: " in none.stderr
    finally:
        brokers.stop_all()


def test_nodes_without_pod_proxy_access_says_which_permission(
        testbed: Testbed, namespace: str, tmp_path: Path) -> None:
    testbed.apply(cluster_manifest("web"), namespace)
    testbed.kubectl("patch", "mqc", "web", "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"sites": [
                        {"ordinal": 0, "id": "AAAA", "pod": "web-0", "state": "up"}]}}))
    testbed.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    testbed.kubectl("create", "role", "reader", "-n", namespace, "--verb=get",
                    "--resource=mqttclusters.mqtt.durablemqtt.io")
    testbed.kubectl("create", "rolebinding", "reader", "-n", namespace, "--role=reader",
                    f"--serviceaccount={namespace}:reader")
    kubeconfig = service_account_kubeconfig(testbed, namespace, "reader",
                                            tmp_path / "reader.kubeconfig")
    assert mqtt(testbed, "sites", "web", kubeconfig=kubeconfig).returncode == 0
    no_key = mqtt(testbed, "nodes", "web", kubeconfig=kubeconfig)
    assert no_key.returncode == 1
    assert f"no access to Secret {namespace}/web-api-key" in no_key.stderr
    assert f"kubectl auth can-i get secret/web-api-key -n {namespace}" in no_key.stderr
    testbed.kubectl("create", "role", "key-reader", "-n", namespace, "--verb=get",
                    "--resource=secrets", "--resource-name=web-api-key")
    testbed.kubectl("create", "rolebinding", "key-reader", "-n", namespace,
                    "--role=key-reader", f"--serviceaccount={namespace}:reader")
    denied = eventually(lambda: (r := mqtt(testbed, "nodes", "web", kubeconfig=kubeconfig))
                        .stderr.count("no access to pod") and r, what="the Secret readable")
    assert denied.returncode == 1 and "403" in denied.stderr
    assert "kubectl auth can-i get pods --subresource=proxy" in denied.stderr
