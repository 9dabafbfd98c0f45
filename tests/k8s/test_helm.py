"""The Helm chart with the real helm binary: lint, template, install/upgrade/uninstall.

The operator runs in-process authenticated as the chart's own ServiceAccount, so the test
also proves the chart's least-privilege RBAC is enough for everything it does.
"""

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.k8s.conftest import (
    ROOT,
    Testbed,
    eventually,
    run_operator,
    service_account_kubeconfig,
)

CHART = ROOT / "helm" / "durable-mqtt"


def helm(testbed: Testbed, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["helm", *args], env=testbed.env, text=True, capture_output=True,
                            timeout=120, check=False)
    if check and result.returncode:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def test_lint_and_template(testbed: Testbed) -> None:
    lint = helm(testbed, "lint", str(CHART), "--strict")
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout
    rendered = list(yaml.safe_load_all(helm(testbed, "template", "rel", str(CHART),
                                            "--namespace", "ns").stdout))
    kinds = sorted(doc["kind"] for doc in rendered if doc)
    assert kinds == ["ConfigMap", "Deployment", "MQTTCluster", "Role", "RoleBinding", "Service",
                     "ServiceAccount"]  # nothing cluster-wide unless operator.clusterWide
    cluster = next(doc for doc in rendered if doc and doc["kind"] == "MQTTCluster")
    assert cluster["metadata"] == {**cluster["metadata"], "name": "rel", "namespace": "ns"}
    assert cluster["spec"]["replicas"] == 3
    assert cluster["spec"]["listeners"]["rpcPort"] == 5369
    assert cluster["spec"]["clusterDomain"] == "cluster.local"
    role = next(doc for doc in rendered if doc and doc["kind"] == "Role")
    # Secrets are made, and read by name (the API key): never listed or watched
    assert [rule["verbs"] for rule in role["rules"] if "secrets" in rule["resources"]] == [
        ["get", "create"]]
    custom = next(doc for doc in yaml.safe_load_all(helm(
        testbed, "template", "rel", str(CHART), "--set", "cluster.listeners.rpcPort=5400",
        "--set", "cluster.clusterDomain=corp.example").stdout)
        if doc and doc["kind"] == "MQTTCluster")
    assert custom["spec"]["listeners"]["rpcPort"] == 5400
    assert custom["spec"]["clusterDomain"] == "corp.example"
    # verifyPeer goes through as set (the operator renders it: test_operator.py)
    mutual = next(doc for doc in yaml.safe_load_all(helm(
        testbed, "template", "rel", str(CHART), "--set", "cluster.tls.secretName=mq-tls",
        "--set", "cluster.tls.verifyPeer=true").stdout) if doc and doc["kind"] == "MQTTCluster")
    assert mutual["spec"]["tls"] == {"secretName": "mq-tls", "verifyPeer": True}
    off = helm(testbed, "template", "rel", str(CHART), "--set", "cluster.enabled=false").stdout
    assert "kind: MQTTCluster" not in off


@pytest.mark.parametrize(("values", "complaint"), [
    (["cluster.replicas=0"], "cluster.replicas"),
    (["cluster.durableStorage.nShards=5000"], "nShards"),
    (["cluster.listeners.rpcPort=0"], "rpcPort"),
    (["cluster.clusterDomain=Not_A.Domain"], "clusterDomain"),
])
def test_invalid_values_fail_naming_the_value(
        testbed: Testbed, values: list[str], complaint: str) -> None:
    args = [arg for value in values for arg in ("--set", value)]
    result = helm(testbed, "template", "rel", str(CHART), *args, check=False)
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr


@pytest.mark.parametrize("replicas", [1, 2])
def test_install_below_the_replication_factor(
        testbed: Testbed, namespace: str, operator_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, replicas: int) -> None:
    """The first thing people try: fewer pods than the default factor of 3. The chart
    installs, its notes say what the factor becomes, and the operator runs the cluster with
    the condition saying the same."""
    installed = helm(testbed, "install", "rel", str(CHART), "--namespace", namespace,
                     "--set", f"cluster.replicas={replicas}", "--set", "operator.resyncSeconds=1")
    assert (f"Replication factor 3 with {replicas} pod(s): each shard keeps {replicas}"
            f" replica(s)") in installed.stdout, installed.stdout
    assert "Anonymous clients are refused" in installed.stdout, installed.stdout
    assert (f"kubectl get secret rel-mqtt-user -n {namespace} -o jsonpath='{{.data.password}}'"
            in installed.stdout), installed.stdout
    assert testbed.get("mqc", "rel", namespace)["spec"]["replicas"] == replicas
    monkeypatch.setenv("KUBECONFIG", str(service_account_kubeconfig(
        testbed, namespace, "rel-operator", tmp_path / "operator.kubeconfig")))

    def conditions() -> dict[str, dict[str, str]]:
        status = testbed.get("mqc", "rel", namespace).get("status") or {}
        return {c["type"]: c for c in status.get("conditions", [])}

    with run_operator(namespace):
        eventually(lambda: (s := testbed.find("statefulset", "rel", namespace)) and s[
            "spec"]["replicas"] == replicas, what=f"StatefulSet of {replicas}")
        capped = eventually(lambda: conditions().get("ReplicationCapped"))
    assert capped["status"] == "True", capped
    assert conditions()["Degraded"]["status"] == "False"
    helm(testbed, "uninstall", "rel", "--namespace", namespace, "--wait")


def test_install_upgrade_scales_uninstall_collects(
        testbed: Testbed, namespace: str, operator_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    helm(testbed, "install", "rel", str(CHART), "--namespace", namespace,
         "--set", "operator.resyncSeconds=1")
    assert testbed.get("deployment", "rel-operator", namespace)["spec"]["replicas"] == 1
    assert testbed.get("mqc", "rel", namespace)["spec"]["replicas"] == 3
    kubeconfig = service_account_kubeconfig(testbed, namespace, "rel-operator",
                                            tmp_path / "operator.kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with run_operator(namespace) as runner:
        eventually(lambda: (s := testbed.find("statefulset", "rel", namespace)) and s[
            "spec"]["replicas"] == 3, what="StatefulSet of 3")
        helm(testbed, "upgrade", "rel", str(CHART), "--namespace", namespace,
             "--reuse-values", "--set", "cluster.replicas=5")
        assert testbed.get("mqc", "rel", namespace)["spec"]["replicas"] == 5
        eventually(lambda: testbed.get("statefulset", "rel", namespace)["spec"][
            "replicas"] == 5, what="StatefulSet of 5")
        eventually(lambda: testbed.find("servicemonitor", "rel", namespace))
        assert testbed.find("secret", "rel-cookie", namespace) is not None  # RBAC: create
        assert testbed.find("secret", "rel-api-key", namespace) is not None  # create, get
        user = testbed.get("secret", "rel-mqtt-user", namespace)  # the generated MQTT user
        assert set(user["data"]) == {"username", "password", "passwd"}
        for verb, allowed in (("get", "yes"), ("list", "no"), ("watch", "no")):
            can = testbed.kubectl("auth", "can-i", verb, "secrets", "-n", namespace,
                                  check=False, env={"KUBECONFIG": str(kubeconfig)})
            assert can.stdout.strip() == allowed, (verb, can.stdout)
        status = eventually(lambda: (s := testbed.get("mqc", "rel", namespace).get(
            "status", {})).get("siteCount") == 5 and s)
        assert status["conditions"][2] == {**status["conditions"][2], "type": "Degraded",
                                           "status": "False"}
    assert "Forbidden" not in runner.output, runner.output  # the chart's RBAC sufficed
    assert "failed with an exception" not in runner.output, runner.output
    helm(testbed, "uninstall", "rel", "--namespace", namespace, "--wait")
    assert testbed.find("mqc", "rel", namespace) is None
    assert testbed.find("deployment", "rel-operator", namespace) is None
    eventually(lambda: testbed.find("statefulset", "rel", namespace) is None,
               what="StatefulSet collected")
    eventually(lambda: testbed.find("configmap", "rel-sites", namespace) is None,
               what="ConfigMaps collected")
    assert testbed.find("crd", "mqttclusters.mqtt.durablemqtt.io", "default") is not None
