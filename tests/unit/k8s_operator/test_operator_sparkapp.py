"""SparkApplication manifests: names are deterministic DNS labels, the data volume is read
only and on the broker pod's node, the cluster owns the application."""

from typing import Any

import pytest

from mqtt_operator import sparkapp
from mqtt_operator.sparkapp import Job, Run

OWNER = {"apiVersion": "mqtt.durablemqtt.io/v1alpha1", "kind": "MQTTCluster", "name": "prod",
         "uid": "0a1b", "controller": True, "blockOwnerDeletion": True}
SPEC = sparkapp.SparkSpec(image="registry.local/mqtt-spark:1", output_claim="lake",
                          executor=sparkapp.Resources(2, "3g", "500m"), executors=3)
TICK = 1763769600  # 2025-11-22T00:00:00Z
EXPORT = Job("export", "lake/raw")
GENERATION = Run(3, generation=12)


def build(job: Job = EXPORT, run: Run = GENERATION) -> dict[str, Any]:
    return sparkapp.spark_application(
        cluster="prod", namespace="iot", owner=OWNER, job=job, run=run,
        broker_pod="prod-1", data_claim="data-prod-1", spec=SPEC)


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
                                 "--output", "/output/lake/raw"]
    # Spark mounts the claims itself (no webhook): the data claim read-only
    for role in ("driver", "executor"):
        volumes = f"spark.kubernetes.{role}.volumes.persistentVolumeClaim"
        assert {key: value for key, value in spec["sparkConf"].items()
                if key.startswith(volumes)} == {
            f"{volumes}.data.options.claimName": "data-prod-1",
            f"{volumes}.data.mount.path": "/data",
            f"{volumes}.data.mount.readOnly": "true",
            f"{volumes}.output.options.claimName": "lake",
            f"{volumes}.output.mount.path": "/output"}
        assert spec[role]["labels"]["mqtt.durablemqtt.io/generation"] == "12"
        # the affinity in a pod template (spark-submit's), on Spark's own container name
        template = spec[role]["template"]["spec"]
        assert template["containers"] == [{"name": f"spark-kubernetes-{role}"}]
        term = template["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["labelSelector"]["matchLabels"] == {
            "statefulset.kubernetes.io/pod-name": "prod-1"}
        assert not {"volumes", "volumeMounts", "affinity"} & {*spec, *spec[role]}
    assert (spec["driver"]["cores"], spec["driver"]["memory"]) == (1, "1g")
    assert (spec["executor"]["cores"], spec["executor"]["memory"],
            spec["executor"]["instances"], spec["executor"]["coreRequest"]) == (2, "3g", 3, "500m")
    assert "coreRequest" not in spec["driver"]  # none given: Spark requests `cores`


def test_stats_output_is_per_run_and_filters_pass_through() -> None:
    args = build(Job("stats", "stats", "fleet/+/gps"), Run(0, generation=7))["spec"][
        "arguments"]
    assert args == ["/data", "--shard", "0", "--generation", "7", "--topic-filter",
                    "fleet/+/gps", "--output", "/output/stats/shard-000/gen-000007"]
    scheduled = build(Job("stats", "hourly"), Run(2, tick=TICK))
    assert scheduled["metadata"]["name"] == "prod-stats-s2-t202511220000"
    assert scheduled["metadata"]["labels"]["mqtt.durablemqtt.io/tick"] == "202511220000"
    # what the shard sealed since the last tick: a streaming run, its checkpoint on the
    # output volume, one output per shard (the same every tick)
    assert scheduled["spec"]["arguments"] == [
        "/data", "--shard", "2", "--stream", "--checkpoint",
        "/output/hourly/_checkpoints/shard-002", "--output", "/output/hourly/shard-002"]
    export = build(Job("export", "raw", "fleet/#"), Run(1, tick=TICK))["spec"]["arguments"]
    assert export == ["/data", "--shard", "1", "--topic-filter", "fleet/#", "--stream",
                      "--checkpoint", "/output/raw/_checkpoints/shard-001",
                      "--output", "/output/raw/shard-001"]


def test_names_are_deterministic_unique_dns_labels() -> None:
    assert build()["metadata"]["name"] == build()["metadata"]["name"]
    names = {sparkapp.application_name("prod", job, run) for job in sparkapp.JOBS
             for run in (*(Run(s, generation=g) for s in range(3) for g in range(3)),
                         Run(0, tick=TICK), Run(0, tick=TICK + 3600))}
    assert len(names) == 2 * (3 * 3 + 2)
    long_a, long_b = "a" * 70 + "-x", "a" * 70 + "-y"
    name_a = sparkapp.application_name(long_a, "export", Run(15, generation=123456))
    name_b = sparkapp.application_name(long_b, "export", Run(15, generation=123456))
    assert name_a != name_b
    odd = sparkapp.application_name("My_Cluster", "stats", Run(1, generation=2))
    for name in (name_a, name_b, odd):
        assert len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert odd == "my-cluster-stats-s1-g2"
    assert sparkapp.parse_tick(sparkapp.tick_label(TICK)) == TICK


def test_unknown_job() -> None:
    with pytest.raises(ValueError, match="unknown Spark job 'count'"):
        build(Job("count", "x"))
