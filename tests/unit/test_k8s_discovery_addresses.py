"""How `cluster.k8s.address_type` names the peers of an Endpoints object (EMQX's forms)."""

from typing import Any

import pytest

from broker.cluster.discovery import K8sEndpoints, in_cluster_apiserver

ENDPOINTS: dict[str, Any] = {"subsets": [
    {"addresses": [{"ip": "10.1.0.7", "hostname": "mq-0"}],
     "notReadyAddresses": [{"ip": "10.1.0.9", "hostname": "mq-1"}],
     "ports": [{"name": "mqtt", "port": 1883}, {"name": "rpc", "port": 5400}]},
    {"addresses": [{"ip": "10.1.0.8", "hostname": "mq-2"}],  # mid-rollout: the old port
     "ports": [{"name": "rpc", "port": 5369}]},
    {"addresses": [{"ip": "10.1.0.10", "hostname": "mq-3"}], "ports": [{"port": 1}]},
]}


@pytest.mark.parametrize(("address_type", "first"), [
    ("ip", "10.1.0.10"),
    ("dns", "10-1-0-10.ns.pod.local"),
    ("hostname", "mq-3.mq-headless.ns.pod.local"),
])
def test_every_address_ready_or_not_on_its_rpc_port(address_type: str, first: str) -> None:
    peers = K8sEndpoints("https://api:6443", "mq-headless", "ns", address_type)
    found = peers.addresses(ENDPOINTS, default_port=6000)
    assert len(found) == 4
    assert (first, 6000) in found  # no port named rpc: rpc.tcp_server_port
    if address_type == "ip":
        assert found == [("10.1.0.10", 6000), ("10.1.0.7", 5400), ("10.1.0.8", 5369),
                         ("10.1.0.9", 5400)]


def test_no_subsets_no_peers() -> None:
    assert K8sEndpoints("https://api", "s", "n").addresses({"kind": "Endpoints"}, 1) == []


def test_in_cluster_api_server_from_the_pods_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert in_cluster_apiserver() == "https://10.0.0.1:443"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert in_cluster_apiserver() == "https://[fd00::1]:443"
