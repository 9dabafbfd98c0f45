"""A SparkApplication of the operator's really running on the node: the chart with a Spark
section, a durable session's messages sealed into a generation, the application the
operator creates for it submitted by tools/spark_submit.py (spark-submit against the API
server, as the Spark operator would run it), driver and executor pods of the Spark image
reading the broker pod's volume read-only while the broker runs, and the Parquet table on
the output volume holding exactly what was published."""

import base64
import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from tests.k8s.conftest import ROOT, Testbed, eventually
from tests.k8s_e2e.cluster import describe, helm, mosquitto, secret_value, wait_brokers
from tests.k8s_e2e.conftest import CHART

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PUBLISHED = {"e2e/a": 200, "e2e/b": 100}
CORES = {"cores": 1, "coreRequest": "200m", "memory": "512m"}  # 2 CPUs for everything


def values(image: str) -> dict[str, Any]:
    return {"cluster": {
        "replicas": 1, "auth": {"allowAnonymous": True},
        "durableStorage": {"nShards": 1, "replicationFactor": 1},
        "spark": {"image": image, "output": {"claimName": "lake"},
                  "jobs": [{"job": "export", "topicFilter": "e2e/#"}],
                  "driver": CORES, "executor": {**CORES, "instances": 1}}}}


def output_claim(node: Testbed, namespace: str) -> None:
    """The output volume: a claim the test bed's hostPath volumes satisfy."""
    node.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "lake"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                         "resources": {"requests": {"storage": "1Gi"}}}}, namespace)


def seal(pod: dict[str, Any], node: Testbed, namespace: str) -> int:
    """The administrator's "seal now" (POST .../generations) on the broker pod."""
    keys = secret_value(node, namespace, "mq-api-key", "api_keys")
    admin = next(line.split(":")[:2] for line in keys.splitlines()
                 if line.endswith(":administrator"))
    request = urllib.request.Request(
        f"http://{pod['status']['podIP']}:18083/api/v5/ds/storages/messages/generations",
        method="POST", headers={
            "Authorization": "Basic " + base64.b64encode(":".join(admin).encode()).decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(json.loads(response.read())["sealed"])


def submit(node: Testbed, namespace: str, app: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "spark_submit.py"), "-n", namespace, app,
         "--timeout", "1200"], env=node.env, text=True, capture_output=True, timeout=1300,
        check=False)


def pod_logs(node: Testbed, namespace: str, selector: str) -> str:
    done = node.kubectl("logs", "-n", namespace, "-l", selector, "--tail", "60", check=False)
    return done.stdout + done.stderr


def test_the_operators_application_runs_on_driver_and_executor_pods(
        node: Testbed, release: tuple[str, str], spark_image: str, tmp_path: Path) -> None:
    namespace, name = release
    output_claim(node, namespace)
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values(spark_image)))
    helm(node, "install", name, str(CHART), "-n", namespace, "-f", str(tmp_path / "values.yaml"))
    (broker,) = wait_brokers(node, namespace, name, 1)
    host = broker["status"]["podIP"]
    # Only messages a durable session subscribed to are stored.
    mosquitto("mosquitto_sub", host, "-i", "lake", "-c", "-x", "3600", "-q", "1", "-t", "e2e/#",
              "-E", timeout=120)
    for topic, count in PUBLISHED.items():
        lines = "".join(f"{topic} {n}\n" for n in range(count))
        mosquitto("mosquitto_pub", host, "-q", "1", "-t", topic, "-l", stdin=lines)
    assert seal(broker, node, namespace) == 1  # the one shard: one generation

    def created() -> list[dict[str, Any]]:
        return node.items("sparkapplications", namespace,
                          f"app.kubernetes.io/instance={name},mqtt.durablemqtt.io/job=export")
    (app,) = eventually(created, timeout=120, what="the operator's SparkApplication")
    app_name = app["metadata"]["name"]
    started = time.monotonic()
    done = submit(node, namespace, app_name)
    took = time.monotonic() - started
    driver_selector = f"sparkoperator.k8s.io/app-name={app_name},spark-role=driver"
    assert done.returncode == 0, (
        f"{done.stdout}\n{done.stderr}\n{describe(node, namespace)}\n"
        f"{pod_logs(node, namespace, driver_selector)}")
    print(f"\nspark application {app_name}: submitted and completed in {took:.0f} s")

    # Spark's scheduler made the pods: the driver as the application said, on the broker
    # pod's node with its volume read-only, and an executor it started.
    (driver,) = node.items("pods", namespace, driver_selector)
    spec = driver["spec"]
    assert (spec["serviceAccountName"], driver["status"]["phase"]) == ("spark", "Succeeded")
    assert spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"]["matchLabels"] == {"statefulset.kubernetes.io/pod-name": "mq-0"}
    assert spec["nodeName"] == broker["spec"]["nodeName"]
    claims = {v["persistentVolumeClaim"]["claimName"]: v["persistentVolumeClaim"].get(
        "readOnly", False) for v in spec["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"data-mq-0": True, "lake": False}
    assert spec["containers"][0]["resources"]["requests"]["cpu"] == "200m"
    events = node.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    executors = {e["involvedObject"]["name"] for e in json.loads(events)["items"]
                 if e["reason"] == "Started" and "-exec-" in e["involvedObject"]["name"]}
    assert len(executors) == 1, executors
    # ...while the broker kept running, and the operator saw the application finish.
    assert wait_brokers(node, namespace, name, 1)[0]["metadata"]["uid"] == broker[
        "metadata"]["uid"]
    eventually(lambda: [a["state"] for a in (node.get("mqttcluster", name, namespace).get(
        "status", {}).get("spark") or {}).get("applications", [])] == ["COMPLETED"],
        timeout=60, what="COMPLETED in the MQTTCluster's status")

    # The Parquet table on the output volume holds every published message once.
    volume = node.get("pv", node.get("pvc", "lake", namespace)["spec"]["volumeName"], "")
    table = pq.read_table(Path(volume["spec"]["hostPath"]["path"]) / "export")
    assert Counter(table.column("topic").to_pylist()) == PUBLISHED
    assert sorted(table.column("payload").to_pylist()) == sorted(
        f"{topic} {n}".encode() for topic, count in PUBLISHED.items() for n in range(count))
