"""`cluster.discovery_strategy = k8s` against the real API server: the Endpoints that the
controller-manager builds from the operator's headless Service, read with the brokers' own
ServiceAccount (its token Secret), over TLS checked against the cluster's CA."""

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.cluster.discovery import K8sEndpoints
from tests.k8s.conftest import (
    Testbed,
    cluster_manifest,
    eventually,
    pod_ip,
    service_account_kubeconfig,
    set_pod_ready,
)


def account_dir(testbed: Testbed, namespace: str, account: str, path: Path) -> Path:
    """What Kubernetes mounts into a pod of that ServiceAccount: its token and the CA."""
    path.mkdir()
    config = json.loads(service_account_kubeconfig(testbed, namespace, account,
                                                   path / "kubeconfig").read_text())
    (path / "token").write_text(config["users"][0]["user"]["token"])
    (path / "ca.crt").write_bytes((testbed.root / "run" / "pki" / "apiserver.crt").read_bytes())
    return path


def bind(testbed: Testbed, namespace: str, pod: str) -> None:
    """What a scheduler does: the pod on a node (Endpoints name each address's node)."""
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "discovery-node"}}
    testbed.kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/binding",
                    "-f", "-", stdin=json.dumps(binding))


def test_brokers_find_every_pod_in_the_endpoints_with_their_own_account(
        testbed: Testbed, namespace: str, operator: Callable[[], Any], tmp_path: Path) -> None:
    with operator():
        testbed.apply(cluster_manifest("found", replicas=2, listeners={"rpcPort": 5400}),
                      namespace)
        pods = eventually(lambda: sorted(
            pod["metadata"]["name"] for pod in testbed.items(
                "pods", namespace, "app.kubernetes.io/instance=found")) if len(testbed.items(
                    "pods", namespace, "app.kubernetes.io/instance=found")) == 2 else None,
            what="two broker pods")
    for host, pod in enumerate(pods, start=1):
        bind(testbed, namespace, pod)
        set_pod_ready(testbed, namespace, pod, ip=pod_ip(host), ready=False)
    server = json.loads(testbed.kubectl("config", "view", "-o", "json").stdout)[
        "clusters"][0]["cluster"]["server"]
    credentials = account_dir(testbed, namespace, "found-broker", tmp_path / "account")
    peers = K8sEndpoints(server, "found-headless", namespace, account_dir=credentials)
    # Not Ready (not joined yet) and still listed: publishNotReadyAddresses.
    assert eventually(lambda: asyncio.run(peers.seeds(1)) == [
        (pod_ip(1), 5400), (pod_ip(2), 5400)], what="both pods in the Endpoints")
    # The Role names the headless Service only: the client Service's Endpoints are refused.
    other = K8sEndpoints(server, "found", namespace, account_dir=credentials)
    assert asyncio.run(other.seeds(1)) == []
    assert asyncio.run(K8sEndpoints(server, "found-headless", namespace,
                                    account_dir=tmp_path / "nobody").seeds(1)) == []
