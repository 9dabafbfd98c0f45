"""SparkApplication manifests: names are deterministic DNS labels, the data volume is read
only, the cluster owns the application."""

import pytest

import sparkapp

OWNER = {"apiVersion": "mqtt.durablemqtt.io/v1alpha1", "kind": "MQTTCluster", "name": "prod",
         "uid": "0a1b", "controller": True, "blockOwnerDeletion": True}
SPEC = sparkapp.SparkSpec(image="registry.local/mqtt-spark:1", output_claim="lake",
                          executor=sparkapp.Resources(2, "3g"), executors=3)


def build(job: str = "export", cluster: str = "prod", shard: int = 3, generation: int = 12):
    return sparkapp.spark_application(
        cluster=cluster, namespace="iot", owner=OWNER, job=job, shard=shard,
        generation=generation, data_claim="data-prod-1", spec=SPEC)


def test_export_application() -> None:
    app = build()
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    assert app["kind"] == "SparkApplication"
    assert app["metadata"]["name"] == "prod-export-s3-g12"
    assert app["metadata"]["namespace"] == "iot"
    assert app["metadata"]["ownerReferences"] == [OWNER]
    spec = app["spec"]
    assert (spec["type"], spec["mode"], spec["image"]) == (
        "Python", "cluster", "registry.local/mqtt-spark:1")
    assert spec["mainApplicationFile"] == "local:///opt/spark-apps/export.py"
    assert spec["arguments"] == ["/data", "--shard", "3", "--generation", "12",
                                 "--output", "/output/export"]
    assert spec["volumes"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data-prod-1",
                                                   "readOnly": True}},
        {"name": "output", "persistentVolumeClaim": {"claimName": "lake"}}]
    for role in ("driver", "executor"):
        assert {"name": "data", "mountPath": "/data", "readOnly": True} in (
            spec[role]["volumeMounts"])
        assert spec[role]["labels"]["mqtt.durablemqtt.io/generation"] == "12"
    assert (spec["driver"]["cores"], spec["driver"]["memory"]) == (1, "1g")
    assert (spec["executor"]["cores"], spec["executor"]["memory"],
            spec["executor"]["instances"]) == (2, "3g", 3)


def test_stats_output_is_per_generation() -> None:
    args = build("stats", shard=0, generation=7)["spec"]["arguments"]
    assert args[-2:] == ["--output", "/output/stats/shard-000/gen-000007"]


def test_names_are_deterministic_unique_dns_labels() -> None:
    assert build()["metadata"]["name"] == build()["metadata"]["name"]
    names = {build(job, shard=s, generation=g)["metadata"]["name"]
             for job in sparkapp.JOBS for s in range(3) for g in range(3)}
    assert len(names) == 2 * 3 * 3
    long_a, long_b = "a" * 70 + "-x", "a" * 70 + "-y"
    name_a = sparkapp.application_name(long_a, "export", 15, 123456)
    name_b = sparkapp.application_name(long_b, "export", 15, 123456)
    assert name_a != name_b
    for name in (name_a, name_b, sparkapp.application_name("My_Cluster", "stats", 1, 2)):
        assert len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert sparkapp.application_name("My_Cluster", "stats", 1, 2) == "my-cluster-stats-s1-g2"


def test_unknown_job() -> None:
    with pytest.raises(ValueError, match="unknown Spark job 'count'"):
        build("count")
