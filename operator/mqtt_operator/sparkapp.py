"""SparkApplication manifests (`sparkoperator.k8s.io/v1beta2`) for the jobs in spark-apps/:
one per (cluster, job, shard, run), a run being one sealed generation or one schedule tick.

Here rather than in spark-apps/ because the operator's image, not the Spark image, builds
them. The name is a function of (cluster, job, shard, run) only: applying the same
application twice writes the same object, never a second run.
"""

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mqtt_operator import constants as c

API_VERSION = "sparkoperator.k8s.io/v1beta2"
KIND = "SparkApplication"
JOBS = {"stats": "stats.py", "export": "export.py"}
APP_DIR = "/opt/spark-apps"  # where spark-apps/Dockerfile puts the jobs
DATA_MOUNT = "/data"
OUTPUT_MOUNT = "/output"
CHECKPOINTS = "_checkpoints"  # under a job's output: Spark's readers skip `_` names
COMPONENT = "spark"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_JOB = f"{c.GROUP}/job"
LABEL_SHARD = f"{c.GROUP}/shard"
LABEL_GENERATION = f"{c.GROUP}/generation"
LABEL_TICK = f"{c.GROUP}/tick"
_TICK_FORMAT = "%Y%m%d%H%M"
# Spark's container names in the driver and executor pods (what a pod template's container
# must be called to be the one Spark runs in).
ROLES = {"driver": "spark-kubernetes-driver", "executor": "spark-kubernetes-executor"}
_MAX_NAME = 63  # a DNS label: the driver pod and its labels carry the name
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class Resources:
    cores: int = 1  # Spark's task slots (spark.{driver,executor}.cores): whole cores
    memory: str = "1g"
    core_request: str | None = None  # the pod's CPU request, e.g. 200m; default: `cores`


@dataclass(frozen=True, slots=True)
class Job:
    kind: str  # a key of JOBS
    output: str  # directory under the output volume
    topic_filter: str = ""


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


@dataclass(frozen=True, slots=True)
class Run:
    """What one application reads of its shard: one sealed generation (on seal), or the
    generations sealed since the previous tick's run (`tick`: epoch seconds of the tick's
    start; the job's streaming checkpoint knows what was read)."""

    shard: int
    generation: int | None = None
    tick: int | None = None

    @property
    def suffix(self) -> str:
        if self.generation is not None:
            return f"s{self.shard}-g{self.generation}"
        return f"s{self.shard}-t{tick_label(self.tick or 0)}"


def tick_label(tick: int) -> str:
    """UTC minutes, `YYYYMMDDHHMM`: readable in names and labels, orderable as text."""
    return datetime.fromtimestamp(tick, UTC).strftime(_TICK_FORMAT)


def parse_tick(label: str) -> int:
    return int(datetime.strptime(label, _TICK_FORMAT).replace(tzinfo=UTC).timestamp())


def application_name(cluster: str, job: str, run: Run) -> str:
    """`<cluster>-<job>-s<shard>-g<generation>` (or `-t<tick>`); a long cluster name is cut
    and given a hash of the whole, so two clusters never share a name."""
    name = _NOT_DNS.sub("-", f"{cluster}-{job}-{run.suffix}".lower()).strip("-")
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    tail = f"-{job}-{run.suffix}-{digest}"
    return _NOT_DNS.sub("-", cluster.lower())[:_MAX_NAME - len(tail)].strip("-") + tail


def run_labels(cluster: str, job: str, run: Run) -> dict[str, str]:
    """What the operator reads back from a listed application (see spark.AppView)."""
    labels = {c.LABEL_INSTANCE: cluster, LABEL_COMPONENT: COMPONENT,
              c.LABEL_MANAGED_BY: c.FIELD_MANAGER, LABEL_JOB: job,
              LABEL_SHARD: str(run.shard)}
    if run.generation is not None:
        labels[LABEL_GENERATION] = str(run.generation)
    else:
        labels[LABEL_TICK] = tick_label(run.tick or 0)
    return labels


def _volume_conf(role: str, name: str, claim: str, path: str,
                 read_only: bool) -> dict[str, str]:
    """A claim mounted by Spark itself (spark.kubernetes.<role>.volumes.*): the Spark
    operator's submission passes only `spark-local-dir-*` volumes on and leaves the others
    to its webhook, which is optional; a `sparkConf` mount needs none."""
    prefix = f"spark.kubernetes.{role}.volumes.persistentVolumeClaim.{name}"
    conf = {f"{prefix}.options.claimName": claim, f"{prefix}.mount.path": path}
    if read_only:  # Spark makes the claim's volume source read-only too
        conf[f"{prefix}.mount.readOnly"] = "true"
    return conf


def _role(resources: Resources, spec: SparkSpec, labels: Mapping[str, str],
          broker_pod: str, container: str) -> dict[str, Any]:
    # The broker's claim is ReadWriteOnce (the StatefulSet's): Spark pods can mount it only
    # on the node where the broker pod runs. A pod template carries the affinity (the
    # Spark operator hands it to spark-submit as a file), not `affinity`, which only its
    # webhook applies.
    affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"statefulset.kubernetes.io/pod-name": broker_pod}},
        "topologyKey": "kubernetes.io/hostname"}]}}
    role = {"cores": resources.cores, "memory": resources.memory,
            "serviceAccount": spec.service_account, "labels": dict(labels),
            "template": {"spec": {"affinity": affinity, "containers": [{"name": container}]}}}
    if resources.core_request is not None:
        role["coreRequest"] = resources.core_request
    return role


def spark_application(
    *, cluster: str, namespace: str, owner: Mapping[str, Any], job: Job, run: Run,
    broker_pod: str, data_claim: str, spec: SparkSpec,
) -> dict[str, Any]:
    """The application that runs `job` over `run`, reading the data volume of `broker_pod`
    read-only (the job copies a slab before opening it, see spark-apps/slabs.py) and writing
    under the output volume; volumes and affinity are in `sparkConf` and pod templates, so
    it runs without the Spark operator's webhook. `owner` is the MQTTCluster's owner
    reference, so deleting the cluster deletes its applications."""
    if job.kind not in JOBS:
        raise ValueError(f"unknown Spark job {job.kind!r} (one of {', '.join(sorted(JOBS))})")
    name = application_name(cluster, job.kind, run)
    labels = run_labels(cluster, job.kind, run)
    selection = ["--shard", str(run.shard)]
    if run.generation is not None:
        selection += ["--generation", str(run.generation)]
    if job.topic_filter:
        selection += ["--topic-filter", job.topic_filter]
    output = f"{OUTPUT_MOUNT}/{job.output}"
    if run.generation is None:
        # A tick reads only what the shard sealed since the last tick: a streaming run
        # (Trigger.AvailableNow) whose checkpoint lives beside its output, one table per
        # shard (a streaming Parquet table has one writer, its _spark_metadata log).
        selection += ["--stream", "--checkpoint", f"{output}/{CHECKPOINTS}/shard-{run.shard:03d}"]
        output += f"/shard-{run.shard:03d}"
    elif job.kind == "stats":  # export overwrites its own partitions; stats would clash
        output += f"/shard-{run.shard:03d}/gen-{run.generation:06d}"
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
            "mainApplicationFile": f"local://{APP_DIR}/{JOBS[job.kind]}",
            "arguments": [DATA_MOUNT, *selection, "--output", output],
            "restartPolicy": {"type": "OnFailure", "onFailureRetries": 2,
                              "onFailureRetryInterval": 30},
            "sparkConf": {
                key: value for role in ROLES for key, value in {
                    **_volume_conf(role, "data", data_claim, DATA_MOUNT, read_only=True),
                    **_volume_conf(role, "output", spec.output_claim, OUTPUT_MOUNT,
                                   read_only=False)}.items()},
            "driver": _role(spec.driver, spec, labels, broker_pod, ROLES["driver"]),
            "executor": {**_role(spec.executor, spec, labels, broker_pod, ROLES["executor"]),
                         "instances": spec.executors},
        },
    }
