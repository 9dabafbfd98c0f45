"""Children manifests: ownership, the pod contract's wiring, and what the spec controls."""

from typing import Any

import pytest

from mqtt_operator import constants as c
from mqtt_operator import manifests
from mqtt_operator.spec import Cluster
from tests.support.crd import body


def all_children(cluster: Cluster) -> list[dict[str, Any]]:
    return [
        manifests.config_map(cluster, c.config_map_name(cluster.name), {"broker.toml": ""}),
        manifests.cookie_secret(cluster, "cookie"),
        manifests.api_key_secret(cluster, "admin-secret", "viewer-secret"),
        manifests.headless_service(cluster), manifests.client_service(cluster),
        manifests.statefulset(cluster, 3, "x"),
        manifests.pod_disruption_budget(cluster, "policy/v1"),
        manifests.service_monitor(cluster),
    ]


def test_every_child_is_owned_by_the_cluster_and_labelled() -> None:
    cluster = Cluster.from_body(body("alpha", "prod"))
    for child in all_children(cluster):
        meta = child["metadata"]
        assert meta["namespace"] == "prod"
        assert meta["ownerReferences"] == [{
            "apiVersion": "mqtt.durablemqtt.io/v1alpha1", "kind": "MQTTCluster",
            "name": "alpha", "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
        assert meta["labels"][c.LABEL_INSTANCE] == "alpha"


def test_statefulset_mounts_what_the_pod_command_reads() -> None:
    cluster = Cluster.from_body(body(storage={"size": "5Gi", "storageClassName": "fast"},
                                     resources={"limits": {"cpu": "1"}},
                                     tolerations=[{"key": "k", "operator": "Exists"}]))
    sts = manifests.statefulset(cluster, 4, "config")
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v.get("configMap", {}).get("name") for v in pod["volumes"]}
    assert spec["replicas"] == 4
    assert spec["serviceName"] == "mqc-headless"
    assert env["MQTT_SITES_DIR"] == mounts["sites"] and volumes["sites"] == "mqc-sites"
    assert env["MQTT_CONFIG_DIR"] == mounts["config"] and volumes["config"] == "mqc-config"
    assert mounts["data"] == c.DATA_DIR
    assert container["command"] == ["/bin/sh", "-c", manifests.POD_SCRIPT]
    # Ready = joined the cluster; alive = answers at all
    assert container["readinessProbe"]["httpGet"] == {"path": "/api/v5/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/status", "port": "http"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "mqtt": 1883, "ws": 8083, "http": 18083, "rpc": 5369}
    assert mounts["cookie"] == c.COOKIE_DIR and volumes["cookie"] is None
    assert next(v for v in pod["volumes"] if v["name"] == "cookie")["secret"] == {
        "secretName": "mqc-cookie", "defaultMode": 0o440}
    assert mounts["api-key"] == c.API_KEY_DIR
    assert next(v for v in pod["volumes"] if v["name"] == "api-key")["secret"] == {
        "secretName": "mqc-api-key", "defaultMode": 0o440}
    assert container["resources"] == {"limits": {"cpu": "1"}}
    assert pod["tolerations"] == [{"key": "k", "operator": "Exists"}]
    claim = spec["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_config_change_rolls_the_pods_and_same_config_does_not() -> None:
    cluster = Cluster.from_body(body())

    def hash_of(text: str) -> str:
        sts = manifests.statefulset(cluster, 3, text)
        return str(sts["spec"]["template"]["metadata"]["annotations"][
            f"{c.GROUP}/config-hash"])

    assert hash_of("a") == hash_of("a") != hash_of("b")


def test_services_expose_the_listeners_and_monitor_scrapes_each_pod() -> None:
    cluster = Cluster.from_body(body(listeners={"serviceType": "LoadBalancer",
                                                "rpcPort": 6000}))
    client, headless = manifests.client_service(cluster), manifests.headless_service(cluster)
    assert client["spec"]["type"] == "LoadBalancer"
    assert [p["port"] for p in client["spec"]["ports"]] == [1883, 8083, 18083]  # no rpc
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["ports"][3] == {"name": "rpc", "port": 6000, "targetPort": "rpc",
                                            "protocol": "TCP"}
    monitor = manifests.service_monitor(cluster)
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= headless["metadata"]["labels"].items()
    assert not selected.items() <= client["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics",
                                             "interval": "30s"}]  # metrics are open


@pytest.mark.parametrize("value", ["true", "on", " Yes", "1"])
def test_monitor_sends_the_viewer_key_when_metrics_ask_for_one(value: str) -> None:
    cluster = Cluster.from_body(body("web", config={"prometheus.enable_basic_auth": value}))
    endpoint = manifests.service_monitor(cluster)["spec"]["endpoints"][0]
    secret = manifests.api_key_secret(cluster, "a", "v")
    assert endpoint["basicAuth"] == {
        "username": {"name": "web-api-key", "key": "username"},
        "password": {"name": "web-api-key", "key": "password"}}
    assert secret["metadata"]["name"] == "web-api-key"
    assert {"username", "password"} <= secret["stringData"].keys()
    off = Cluster.from_body(body("web", config={"prometheus.enable_basic_auth": "false"}))
    assert "basicAuth" not in manifests.service_monitor(off)["spec"]["endpoints"][0]


def test_pdb_follows_the_served_policy_version() -> None:
    cluster = Cluster.from_body(body())
    old = manifests.pod_disruption_budget(cluster, "policy/v1beta1")
    assert old["apiVersion"] == "policy/v1beta1"
    assert old["spec"]["maxUnavailable"] == 1


def test_cookie_secret_is_immutable_and_mounted_only_by_pods_of_contract_v2() -> None:
    cluster = Cluster.from_body(body())
    secret = manifests.cookie_secret(cluster, "abc")
    assert secret["metadata"]["name"] == "mqc-cookie"
    assert secret["immutable"] is True and secret["stringData"] == {c.COOKIE_KEY: "abc"}
    current = manifests.statefulset(cluster, 3, "x")
    assert manifests.mounts_cookie(current)
    assert not manifests.mounts_cookie(None)  # a new cluster
    older = manifests.statefulset(cluster, 3, "x")  # as contract v1 rendered it
    older["spec"]["template"]["spec"]["volumes"] = [
        v for v in older["spec"]["template"]["spec"]["volumes"] if v["name"] != "cookie"]
    assert not manifests.mounts_cookie(older)
