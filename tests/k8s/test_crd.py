"""The MQTTCluster CRD on a real API server: schema bounds, defaults, printer columns, scale."""

from typing import Any

import pytest
import yaml

from tests.k8s.conftest import Testbed


def cluster(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "mqtt.durablemqtt.io/v1alpha1", "kind": "MQTTCluster",
            "metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize(("spec", "field"), [
    ({"replicas": 0}, "spec.replicas"),
    ({"durableStorage": {"nShards": 5000}}, "spec.durableStorage.nShards"),
    ({"durableStorage": {"replicationFactor": 0}}, "spec.durableStorage.replicationFactor"),
    ({"storage": {"size": "lots"}}, "spec.storage.size"),
    ({"durableSessions": {"messageRetentionPeriod": "forever"}},
     "spec.durableSessions.messageRetentionPeriod"),
    ({"listeners": {"serviceType": "Ingress"}}, "spec.listeners.serviceType"),
    ({"listeners": {"rpcPort": 70000}}, "spec.listeners.rpcPort"),
    ({"clusterDomain": "Not_A.Domain"}, "spec.clusterDomain"),
    ({"config": {"mqtt.max_inflight": 64}}, "spec.config.mqtt.max_inflight"),
])
def test_invalid_cluster_is_rejected_naming_the_field(
        testbed: Testbed, namespace: str, spec: dict[str, Any], field: str) -> None:
    result = testbed.kubectl("apply", "-n", namespace, "-f", "-", check=False,
                             stdin=yaml.safe_dump(cluster("bad", **spec)))
    assert result.returncode != 0
    assert field in result.stderr, result.stderr
    assert testbed.find("mqc", "bad", namespace) is None


def test_defaults_columns_and_scale_subresource(testbed: Testbed, namespace: str) -> None:
    testbed.apply(cluster("plain"), namespace)
    spec = testbed.get("mqttcluster", "plain", namespace)["spec"]
    assert spec["replicas"] == 3
    assert spec["durableStorage"] == {"nShards": 16, "replicationFactor": 3}
    assert spec["storage"] == {"size": "1Gi"}
    assert spec["listeners"]["mqttPort"] == 1883
    assert spec["listeners"]["rpcPort"] == 5369
    assert spec["clusterDomain"] == "cluster.local"
    header = testbed.kubectl("get", "mqc", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "REPLICAS", "READY", "SITES", "PHASE", "AGE"]
    testbed.kubectl("scale", "mqc/plain", "-n", namespace, "--replicas=5")
    assert testbed.get("mqc", "plain", namespace)["spec"]["replicas"] == 5
