"""SparkApplications for sealed generations, on the real API server (the Spark operator's
CRD installed, its controller not needed: the test reports application states the way it
would). The operator runs as the Helm chart's ServiceAccount, so the chart's RBAC for
sparkapplications is proven sufficient; the brokers are a local fake HTTP server."""

import json
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import (
    FakeBrokers,
    Testbed,
    cluster_manifest,
    event_reasons,
    eventually,
    run_operator,
    service_account_kubeconfig,
    set_pod_ready,
)
from tests.k8s.test_helm import CHART, helm
from tests.k8s.test_operator import reconciles, status_of

SPARK = {
    "image": "durable-mqtt-spark:test",
    "output": {"claimName": "lake-out"},
    "jobs": [{"job": "stats"}, {"job": "export", "topicFilter": "fleet/#", "output": "raw"}],
    "driver": {"memory": "512m"},
    "executor": {"instances": 2, "cores": 2, "memory": "2g"},
    "retention": {"keepFinished": 1},
}


def applications(testbed: Testbed, namespace: str) -> dict[str, dict[str, Any]]:
    return {app["metadata"]["name"]: app for app in testbed.items(
        "sparkapplications", namespace, "app.kubernetes.io/instance=lake")}


def set_state(testbed: Testbed, namespace: str, name: str, state: str) -> None:
    """What the Spark operator's controller would report."""
    testbed.kubectl("patch", "sparkapplication", name, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"applicationState": {
                        "state": state}}}))


def reported(testbed: Testbed, namespace: str) -> dict[str, str]:
    spark = status_of(testbed, namespace, "lake").get("spark") or {}
    return {app["name"]: app["state"] for app in spark.get("applications", [])}


def test_sealed_generations_become_owned_applications_once_with_states_and_retention(
        testbed: Testbed, namespace: str, operator_env: dict[str, str], brokers: FakeBrokers,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    helm(testbed, "install", "rel", str(CHART), "--namespace", namespace,
         "--set", "cluster.enabled=false")
    monkeypatch.setenv("KUBECONFIG", str(service_account_kubeconfig(
        testbed, namespace, "rel-operator", tmp_path / "operator.kubeconfig")))
    first = ["lake-export-s0-g1", "lake-export-s1-g1", "lake-stats-s0-g1", "lake-stats-s1-g1"]
    brokers.sealed = {0: [1], 1: [1]}
    with run_operator(namespace) as runner:
        testbed.apply(cluster_manifest(
            "lake", replicas=2, durableStorage={"nShards": 2, "replicationFactor": 2},
            listeners={"httpPort": brokers.port}, spark=SPARK), namespace)
        for ordinal in range(2):  # the operator asks ready brokers only
            pod = f"lake-{ordinal}"
            eventually(lambda p=pod: testbed.find("pod", p, namespace), what=pod)
            set_pod_ready(testbed, namespace, pod)
        apps = eventually(lambda: sorted(a := applications(testbed, namespace)) == first and a,
                          what="one application per job and sealed (shard, generation)")
        uid = testbed.get("mqc", "lake", namespace)["metadata"]["uid"]
        status = status_of(testbed, namespace, "lake")
        ordinal_of = {site: int(o) for o, site in status["siteIds"].items()}
        for name, app in apps.items():
            assert [(o["kind"], o["uid"], o["controller"]) for o in app["metadata"][
                "ownerReferences"]] == [("MQTTCluster", uid, True)]
            spec, shard = app["spec"], int(app["metadata"]["labels"][
                "mqtt.durablemqtt.io/shard"])
            job = name.split("-")[1]
            source = ordinal_of[status["placement"]["shards"][str(shard)][0]]
            assert (spec["type"], spec["mainApplicationFile"], spec["image"]) == (
                "Python", f"local:///opt/spark-apps/{job}.py", "durable-mqtt-spark:test")
            for role in ("driver", "executor"):  # mounted by Spark: no webhook needed
                claims = f"spark.kubernetes.{role}.volumes.persistentVolumeClaim"
                assert (spec["sparkConf"][f"{claims}.data.options.claimName"],
                        spec["sparkConf"][f"{claims}.data.mount.readOnly"],
                        spec["sparkConf"][f"{claims}.output.options.claimName"]) == (
                    f"data-lake-{source}", "true", "lake-out")
            assert (spec["driver"]["cores"], spec["driver"]["memory"]) == (1, "512m")
            assert (spec["executor"]["instances"], spec["executor"]["cores"],
                    spec["executor"]["memory"]) == (2, 2, "2g")
        assert apps["lake-export-s1-g1"]["spec"]["arguments"] == [
            "/data", "--shard", "1", "--generation", "1", "--topic-filter", "fleet/#",
            "--output", "/output/raw"]
        eventually(lambda: reported(testbed, namespace) == dict.fromkeys(first, "NEW"))
        count = reconciles(operator_env)
    assert "Forbidden" not in runner.output, runner.output  # the chart's RBAC sufficed

    uids = {name: app["metadata"]["uid"] for name, app in apps.items()}
    with run_operator(namespace) as runner:  # a restart: resumes, polls, creates nothing
        eventually(lambda: reconciles(operator_env) >= count + 4, what="resume + polls")
        assert {n: a["metadata"]["uid"] for n, a in applications(
            testbed, namespace).items()} == uids
        assert event_reasons(testbed, namespace, "lake").count(
            "SparkApplicationsCreated") == 1

        for name in ("lake-stats-s0-g1", "lake-export-s0-g1"):
            set_state(testbed, namespace, name, "COMPLETED")
        eventually(lambda: reported(testbed, namespace) == {
            **dict.fromkeys(first, "NEW"), "lake-stats-s0-g1": "COMPLETED",
            "lake-export-s0-g1": "COMPLETED"}, what="states in the MQTTCluster status")

        brokers.sealed = {0: [1, 2], 1: [1]}  # the brokers sealed generation 2 of shard 0
        second = ["lake-export-s0-g2", "lake-stats-s0-g2"]
        eventually(lambda: set(second) <= set(applications(testbed, namespace)),
                   what="applications for the newly sealed generation")
        for name in second:
            set_state(testbed, namespace, name, "COMPLETED")
        # keepFinished 1 per job: the older finished ones go, the running ones stay...
        kept = ["lake-export-s0-g2", "lake-export-s1-g1", "lake-stats-s0-g2",
                "lake-stats-s1-g1"]
        eventually(lambda: sorted(applications(testbed, namespace)) == kept,
                   what="old finished applications deleted")
        eventually(lambda: sorted(reported(testbed, namespace)) == kept)
        # ...and are never created again, although the brokers still hold generation 1.
        count = reconciles(operator_env)
        eventually(lambda: reconciles(operator_env) >= count + 3, what="more polls")
        assert sorted(applications(testbed, namespace)) == kept
        assert "SparkApplicationsDeleted" in event_reasons(testbed, namespace, "lake")
    assert "Forbidden" not in runner.output, runner.output

    testbed.kubectl("delete", "mqc", "lake", "-n", namespace)
    eventually(lambda: not applications(testbed, namespace), timeout=60,
               what="applications collected with their cluster")


def test_spark_section_is_validated_and_defaulted(testbed: Testbed, namespace: str) -> None:
    for spark, field in [({**SPARK, "schedule": "@hourly"}, "spec.spark.schedule"),
                         ({**SPARK, "retention": {"keepFinished": 0}},
                          "spec.spark.retention.keepFinished"),
                         ({**SPARK, "jobs": [{"job": "count"}]}, "spec.spark.jobs"),
                         ({**SPARK, "driver": {"coreRequest": "0.2 cores"}},
                          "spec.spark.driver.coreRequest"),
                         ({"image": "x"}, 'required field "output"')]:
        result = testbed.kubectl("apply", "-n", namespace, "-f", "-", check=False,
                                 stdin=json.dumps(cluster_manifest("bad", spark=spark)))
        assert result.returncode != 0 and field in result.stderr, result.stderr
    testbed.apply(cluster_manifest("ok", spark={"image": "x", "output": {"claimName": "o"}}),
                  namespace)
    spark = testbed.get("mqc", "ok", namespace)["spec"]["spark"]
    assert spark == {"image": "x", "output": {"claimName": "o"}, "schedule": "onSeal",
                     "sparkVersion": "4.0.0", "serviceAccount": "spark",
                     "jobs": [{"job": "stats"}], "driver": {"cores": 1, "memory": "1g"},
                     "executor": {"cores": 1, "memory": "1g", "instances": 1},
                     "retention": {"keepFinished": 10}}


def test_the_charts_spark_account_may_do_what_a_driver_does_and_no_more(
        testbed: Testbed, namespace: str) -> None:
    """What Spark on Kubernetes does as the driver's account (and spark-submit, which
    tools/spark_submit.py runs as it too), asked of the API server's RBAC."""
    helm(testbed, "install", "rel", str(CHART), "--namespace", namespace,
         "--set", "cluster.spark.image=durable-mqtt-spark:test",
         "--set", "cluster.spark.output.claimName=lake")
    account = f"system:serviceaccount:{namespace}:spark"

    def allowed(verb: str, resource: str, *more: str) -> bool:
        answer = testbed.kubectl("auth", "can-i", verb, resource, *more, "-n", namespace,
                                 "--as", account, check=False).stdout.strip()
        return answer == "yes"
    for resource in ("pods", "services", "configmaps", "persistentvolumeclaims"):
        # patch: Spark 4 applies its driver's Service and ConfigMaps server-side
        for verb in ("get", "list", "watch", "create", "patch", "delete", "deletecollection"):
            assert allowed(verb, resource), f"{verb} {resource}"
    for verb in ("create", "patch", "delete"):  # Spark 4.2+: its executors' NetworkPolicy
        assert allowed(verb, "networkpolicies.networking.k8s.io"), verb
    for denied in (("get", "secrets"), ("create", "pods", "--subresource=exec"),
                   ("create", "statefulsets"), ("list", "sparkapplications.sparkoperator.k8s.io")):
        assert not allowed(*denied), denied
    # no Spark section, no Spark account
    rendered = helm(testbed, "template", "rel", str(CHART)).stdout
    assert "name: spark" not in rendered
