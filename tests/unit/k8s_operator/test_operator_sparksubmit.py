"""spark-submit's arguments for a SparkApplication, by the rules of the Kubeflow Spark
operator's submission.go (buildSparkSubmitArgs): its option order, its labels, what it
leaves out, and the pod templates it writes."""

from typing import Any

import pytest

from mqtt_operator import sparkapp, sparksubmit
from mqtt_operator.sparkapp import Job, Resources, Run

MASTER = "k8s://https://10.0.0.1:443"
TEMPLATES = "/tmp/spark/templates"
OWNER = {"apiVersion": "mqtt.durablemqtt.io/v1alpha1", "kind": "MQTTCluster", "name": "mq",
         "uid": "c1", "controller": True, "blockOwnerDeletion": True}


def rendered() -> dict[str, Any]:
    """What the operator creates, as the API server returns it (with a uid)."""
    app = sparkapp.spark_application(
        cluster="mq", namespace="iot", owner=OWNER, job=Job("export", "raw", "e2e/#"),
        run=Run(0, generation=1), broker_pod="mq-0", data_claim="data-mq-0",
        spec=sparkapp.SparkSpec(image="durable-mqtt-spark:0.2.0", output_claim="lake",
                                driver=Resources(1, "512m", "200m"),
                                executor=Resources(1, "512m", "300m")))
    app["metadata"]["uid"] = "a1"
    return app


def conf(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--conf"]


def test_the_operators_application_as_submission_go_submits_it() -> None:
    app = rendered()
    done = sparksubmit.submission(app, MASTER, "s-1", TEMPLATES)
    argv = done.argv
    assert argv[:6] == ["--master", MASTER, "--deploy-mode", "cluster", "--name",
                        "mq-export-s0-g1"]
    # the main file, then the application's arguments, last
    assert argv[-10:] == ["local:///opt/spark-apps/export.py", "/data", "--shard", "0",
                          "--generation", "1", "--topic-filter", "e2e/#", "--output",
                          "/output/raw"]
    labels = app["metadata"]["labels"]
    volumes = sorted(f"{k}={v}" for k, v in app["spec"]["sparkConf"].items())
    assert conf(argv) == [
        "spark.kubernetes.namespace=iot",
        "spark.kubernetes.container.image=durable-mqtt-spark:0.2.0",
        "spark.kubernetes.pyspark.pythonVersion=3",
        "spark.kubernetes.submission.waitAppCompletion=false",
        *volumes,
        "spark.kubernetes.driver.pod.name=mq-export-s0-g1-driver",
        "spark.kubernetes.driver.label.sparkoperator.k8s.io/app-name=mq-export-s0-g1",
        "spark.kubernetes.driver.label.sparkoperator.k8s.io/launched-by-spark-operator=true",
        # a template: no "mutated-by-spark-operator" label, which asks for the webhook
        "spark.kubernetes.driver.label.sparkoperator.k8s.io/submission-id=s-1",
        "spark.kubernetes.driver.container.image=durable-mqtt-spark:0.2.0",
        "spark.driver.cores=1",
        "spark.kubernetes.driver.request.cores=200m",
        "spark.driver.memory=512m",
        "spark.kubernetes.authenticate.driver.serviceAccountName=spark",
        # the application's labels, then the role's (the same here)
        *(f"spark.kubernetes.driver.label.{k}={v}" for k, v in sorted(labels.items())),
        *(f"spark.kubernetes.driver.label.{k}={v}" for k, v in sorted(labels.items())),
        "spark.kubernetes.executor.label.sparkoperator.k8s.io/app-name=mq-export-s0-g1",
        "spark.kubernetes.executor.label.sparkoperator.k8s.io/launched-by-spark-operator=true",
        "spark.kubernetes.executor.label.sparkoperator.k8s.io/submission-id=s-1",
        "spark.executor.instances=1",
        "spark.kubernetes.executor.container.image=durable-mqtt-spark:0.2.0",
        "spark.executor.cores=1",
        "spark.kubernetes.executor.request.cores=300m",
        "spark.executor.memory=512m",
        "spark.kubernetes.authenticate.executor.serviceAccountName=spark",
        *(f"spark.kubernetes.executor.label.{k}={v}" for k, v in sorted(labels.items())),
        *(f"spark.kubernetes.executor.label.{k}={v}" for k, v in sorted(labels.items())),
        f"spark.kubernetes.driver.podTemplateFile={TEMPLATES}/driver-pod-template.yaml",
        "spark.kubernetes.driver.podTemplateContainerName=spark-kubernetes-driver",
        f"spark.kubernetes.executor.podTemplateFile={TEMPLATES}/executor-pod-template.yaml",
        "spark.kubernetes.executor.podTemplateContainerName=spark-kubernetes-executor",
    ]
    assert any(c.endswith("persistentVolumeClaim.data.mount.readOnly=true") for c in volumes)


def test_pod_templates_are_the_roles_own_and_owned_by_the_application() -> None:
    app = rendered()
    templates = sparksubmit.submission(app, MASTER, "s-1", TEMPLATES).templates
    owner = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
             "name": "mq-export-s0-g1", "uid": "a1"}
    driver, executor = templates["driver-pod-template.yaml"], templates[
        "executor-pod-template.yaml"]
    assert driver["metadata"]["ownerReferences"] == [
        {**owner, "controller": True, "blockOwnerDeletion": True}]
    assert executor["metadata"]["ownerReferences"] == [owner]  # not a controller reference
    for role, template in (("driver", driver), ("executor", executor)):
        assert (template["kind"], template["spec"]) == ("Pod", app["spec"][role]["template"][
            "spec"])
        assert template["spec"]["affinity"]["podAffinity"]  # on the broker pod's node
    app["spec"]["driver"].pop("template")
    bare = sparksubmit.submission(app, MASTER, "s-1", TEMPLATES)
    # no template given: Spark's container name alone, and the webhook label
    assert bare.templates["driver-pod-template.yaml"]["spec"] == {
        "containers": [{"name": "spark-kubernetes-driver"}]}
    assert ("spark.kubernetes.driver.label.sparkoperator.k8s.io/mutated-by-spark-operator="
            "true") in conf(bare.argv)


def test_driver_pod_name_master_hadoop_env_and_kueue_labels() -> None:
    app = rendered()
    spec = app["spec"]
    spec["sparkConf"] = {"spark.kubernetes.driver.pod.name": "custom-driver",
                         "spark.sql.shuffle.partitions": "4"}
    spec["hadoopConf"] = {"fs.defaultFS": "file:///"}
    spec["driver"]["envVars"] = {"B": "2", "A": "1"}
    spec["executor"]["javaOptions"] = "-Dx=1"
    spec["executor"]["envVars"] = {"C": "3"}
    app["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "q"
    argv = conf(sparksubmit.submission(app, MASTER, "s-1", TEMPLATES,
                                       driver_master="https://10.0.0.1:443").argv)
    # the pod name from sparkConf is set once, where submission.go sets it
    assert [c for c in argv if c.startswith("spark.kubernetes.driver.pod.name=")] == [
        "spark.kubernetes.driver.pod.name=custom-driver"]
    assert sparksubmit.driver_pod_name(app) == "custom-driver"
    assert argv.index("spark.sql.shuffle.partitions=4") < argv.index(
        "spark.hadoop.fs.defaultFS=file:///") < argv.index(
        "spark.kubernetes.driver.pod.name=custom-driver")
    assert "spark.kubernetes.driver.master=https://10.0.0.1:443" in argv
    assert not [c for c in argv if "kueue" in c]  # not propagated to the pods
    env = [c for c in argv if "Env." in c]
    assert env == ["spark.kubernetes.driverEnv.A=1", "spark.kubernetes.driverEnv.B=2",
                   "spark.executorEnv.C=3"]
    assert argv.index("spark.executor.extraJavaOptions=-Dx=1") < argv.index(
        "spark.executorEnv.C=3")
    # the application's own driver master wins over the submitter's
    spec["driver"]["kubernetesMaster"] = "https://api.internal:6443"
    argv = conf(sparksubmit.submission(app, MASTER, "s-1", TEMPLATES,
                                       driver_master="https://10.0.0.1:443").argv)
    assert [c for c in argv if c.startswith("spark.kubernetes.driver.master=")] == [
        "spark.kubernetes.driver.master=https://api.internal:6443"]
    assert sparksubmit.driver_pod_name({"metadata": {"name": "x"}, "spec": {"driver": {}}}) == (
        "x-driver")


def test_fields_it_does_not_translate_are_refused_by_name() -> None:
    app = rendered()
    app["spec"]["dynamicAllocation"] = {"enabled": True}
    app["spec"]["driver"]["secrets"] = [{"name": "s", "path": "/s"}]
    with pytest.raises(ValueError, match=r"spec\.dynamicAllocation, spec\.driver\.secrets"):
        sparksubmit.submission(app, MASTER, "s-1", TEMPLATES)
