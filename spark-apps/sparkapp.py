"""SparkApplication manifests (`sparkoperator.k8s.io/v1beta2`) for the jobs in this folder,
as the operator will create them: one per (cluster, job, shard, sealed generation).

A pure function so the operator stays a thin caller and the manifest is unit-tested. The
name is a function of (cluster, job, shard, generation) only: creating the same
application twice is a conflict the operator can ignore, never a second run.
"""

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "sparkoperator.k8s.io/v1beta2"
KIND = "SparkApplication"
JOBS = {"stats": "stats.py", "export": "export.py"}
APP_DIR = "/opt/spark-apps"  # where spark-apps/Dockerfile puts the jobs
DATA_MOUNT = "/data"
OUTPUT_MOUNT = "/output"
_MAX_NAME = 63  # a DNS label: the driver pod and its labels carry the name
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class Resources:
    cores: int = 1
    memory: str = "1g"


@dataclass(frozen=True, slots=True)
class SparkSpec:
    """The MQTTCluster's `spark` section, as far as one application needs it."""

    image: str
    output_claim: str
    spark_version: str = "4.0.0"
    service_account: str = "spark"
    driver: Resources = field(default_factory=Resources)
    executor: Resources = field(default_factory=Resources)
    executors: int = 1
    extra_args: tuple[str, ...] = ()


def application_name(cluster: str, job: str, shard: int, generation: int) -> str:
    """`<cluster>-<job>-s<shard>-g<generation>`; a long cluster name is cut and given a
    hash of the whole, so two clusters never share a name."""
    name = _NOT_DNS.sub("-", f"{cluster}-{job}-s{shard}-g{generation}".lower()).strip("-")
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    tail = f"-{job}-s{shard}-g{generation}-{digest}"
    return _NOT_DNS.sub("-", cluster.lower())[:_MAX_NAME - len(tail)].strip("-") + tail


def _role(resources: Resources, spec: SparkSpec, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"cores": resources.cores, "memory": resources.memory, "volumeMounts": mounts,
            "serviceAccount": spec.service_account}


def spark_application(
    *, cluster: str, namespace: str, owner: Mapping[str, Any], job: str, shard: int,
    generation: int, data_claim: str, spec: SparkSpec,
) -> dict[str, Any]:
    """The application that runs `job` over one sealed generation of one shard, reading the
    broker's data volume read-only (the job copies the slab before opening it, see
    slabs.py) and writing under the output volume. `owner` is the MQTTCluster's owner
    reference, so deleting the cluster deletes its applications."""
    if job not in JOBS:
        raise ValueError(f"unknown Spark job {job!r} (one of {', '.join(sorted(JOBS))})")
    name = application_name(cluster, job, shard, generation)
    mounts = [{"name": "data", "mountPath": DATA_MOUNT, "readOnly": True},
              {"name": "output", "mountPath": OUTPUT_MOUNT}]
    labels = {"app.kubernetes.io/instance": cluster, "app.kubernetes.io/component": "spark",
              "mqtt.durablemqtt.io/job": job, "mqtt.durablemqtt.io/shard": str(shard),
              "mqtt.durablemqtt.io/generation": str(generation)}
    output = f"{OUTPUT_MOUNT}/{job}" if job == "export" else (
        f"{OUTPUT_MOUNT}/{job}/shard-{shard:03d}/gen-{generation:06d}")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "ownerReferences": [dict(owner)]},
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": spec.image,
            "sparkVersion": spec.spark_version,
            "mainApplicationFile": f"local://{APP_DIR}/{JOBS[job]}",
            "arguments": [DATA_MOUNT, "--shard", str(shard), "--generation", str(generation),
                          "--output", output, *spec.extra_args],
            "restartPolicy": {"type": "OnFailure", "onFailureRetries": 2,
                              "onFailureRetryInterval": 30},
            "volumes": [
                {"name": "data",
                 "persistentVolumeClaim": {"claimName": data_claim, "readOnly": True}},
                {"name": "output", "persistentVolumeClaim": {"claimName": spec.output_claim}},
            ],
            "driver": {**_role(spec.driver, spec, mounts), "labels": labels},
            "executor": {**_role(spec.executor, spec, mounts), "labels": labels,
                         "instances": spec.executors},
        },
    }
