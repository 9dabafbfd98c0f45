"""Scheduled exports and a restore as Kubernetes objects: a CronJob and a Job that run
`broker ctl data export|import` in the broker image against the cluster's HTTP API.

Pure functions of the spec, like manifests.py. The Jobs' pods report through their
termination message (kubelet copies `/dev/termination-log` into the pod's status): the
export's JSON line on success, the command's last output on failure
(`FallbackToLogsOnError`). So the operator learns the result from the pod objects it
already lists and watches, and the pods need no API access at all (no ServiceAccount token
is mounted), nor anything in the image besides `broker` and the shell's tools.

The pods carry `app.kubernetes.io/name: mqtt-backup`, not the brokers' `mqtt-broker`: the
client Service, the PodDisruptionBudget and the StatefulSet select by the latter, and must
not count a backup run as a broker.
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mqtt_operator import constants as c
from mqtt_operator import cron
from mqtt_operator.manifests import SECRET_MODE, Manifest, metadata
from mqtt_operator.spec import Cluster

APP_NAME = "mqtt-backup"
LABEL_COMPONENT = "app.kubernetes.io/component"
BACKUP, RESTORE = "backup", "restore"
BACKUP_DIR = "/backups"
RESTORE_DIR = "/restore"
# The archives a cluster's CronJob writes, and the only files its pruning may delete: the
# stamp keeps cluster `a` off cluster `a-b`'s archives on a shared claim.
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
ARCHIVE_REGEX = "[0-9]{8}T[0-9]{6}Z\\.tar"
JOB_HISTORY = 3  # finished Jobs (and their pods) kept per outcome: read before they go
# Exports stream the archive from the brokers to the claim: little CPU or memory of their own.
RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"},
             "limits": {"cpu": "500m", "memory": "256Mi"}}
_API_KEY_FILE = f"{c.API_KEY_DIR}/{c.API_KEYS_FILE}"  # its first key: the administrator's

# One export, then the pruning: only after a successful export (set -e), only this
# cluster's archives, the newest MQTT_KEEP kept (the stamp sorts by time). A `.part` left by
# a run killed midway goes first. The export's JSON line is the termination message.
EXPORT_SCRIPT = (
    'set -eu; cd "$MQTT_BACKUP_DIR"; '
    'rm -f "$MQTT_CLUSTER"-[0-9]*T[0-9]*Z.tar.part; '
    'file="$MQTT_BACKUP_DIR/$MQTT_CLUSTER-$(date -u +%Y%m%dT%H%M%SZ).tar"; '
    'broker ctl data export "$file" --url "$MQTT_URL" --api-key-file "$MQTT_API_KEY_FILE"'
    ' -o json > /dev/termination-log; '
)
PRUNE_SCRIPT = (
    'ls -1 | grep -E "^$MQTT_CLUSTER-' + ARCHIVE_REGEX + '\\$" | sort -r'
    ' | tail -n +"$((MQTT_KEEP + 1))" | while read -r old; do rm -f -- "$old"; done'
)
# The import's output (its counts, or why it refused) is the termination message.
IMPORT_SCRIPT = (
    'set -eu; exec > /dev/termination-log 2>&1; '
    'exec broker ctl data import "$MQTT_RESTORE_DIR/$MQTT_RESTORE_FILE" --url "$MQTT_URL"'
    ' --api-key-file "$MQTT_API_KEY_FILE"'
)


@dataclass(frozen=True)
class BackupSpec:
    schedule: str
    claim: str
    keep: int
    suspend: bool

    @classmethod
    def from_spec(cls, section: Mapping[str, Any] | None) -> "BackupSpec | None":
        if section is None:
            return None
        return cls(section["schedule"], section["claimName"], section["keep"],
                   section["suspend"])


@dataclass(frozen=True)
class RestoreSpec:
    claim: str
    file: str

    @classmethod
    def from_spec(cls, section: Mapping[str, Any] | None) -> "RestoreSpec | None":
        return None if section is None else cls(section["claimName"], section["file"])


def schedule_problem(backup: BackupSpec) -> str:
    """Why the API server would refuse the schedule ("" when it is fine)."""
    try:
        cron.parse(backup.schedule)
    except ValueError as error:
        return (f"spec.backup.schedule {backup.schedule!r} is not a cron schedule: {error};"
                f" the CronJob keeps its last valid schedule")
    return ""


def cronjob_name(cluster: str) -> str:
    return f"{cluster}-backup"


def restore_job_name(cluster: str, restore: RestoreSpec) -> str:
    """Named for the archive: another archive is another Job, the same one never twice."""
    digest = hashlib.sha256(f"{restore.claim}/{restore.file}".encode()).hexdigest()[:8]
    return f"{cluster}-restore-{digest}"


def pod_labels(cluster: str, component: str) -> dict[str, str]:
    return {c.LABEL_NAME: APP_NAME, c.LABEL_INSTANCE: cluster, LABEL_COMPONENT: component,
            c.LABEL_MANAGED_BY: c.FIELD_MANAGER}


def api_url(service_ip: str, cluster: Cluster) -> str:
    """The client Service's cluster IP, not its DNS name: the Jobs work without cluster DNS,
    as the brokers do (contract section 1)."""
    host = f"[{service_ip}]" if ":" in service_ip else service_ip
    return f"http://{host}:{cluster.http_port}"


def _job_metadata(cluster: Cluster, name: str, component: str) -> Manifest:
    """Owned by the MQTTCluster (collected with it), labelled like the pods it makes."""
    return {**metadata(cluster, name), "labels": pod_labels(cluster.name, component)}


def _env(**values: str | int) -> list[Manifest]:
    return [{"name": f"MQTT_{key.upper()}", "value": str(value)} for key, value in values.items()]


def _pod(cluster: Cluster, component: str, script: str, env: list[Manifest],
         claim: tuple[str, str, bool]) -> Manifest:
    """The Jobs' pod: the broker image, the claim (name, mount, read-only) and the API key
    file, no ServiceAccount token, on the nodes the brokers may use."""
    claim_name, mount, read_only = claim
    container: Manifest = {
        "name": component,
        "image": cluster.image,
        "imagePullPolicy": cluster.image_pull_policy,
        "command": ["/bin/sh", "-c", script],
        "env": [*env, *_env(api_key_file=_API_KEY_FILE)],
        "resources": RESOURCES,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "archives", "mountPath": mount, "readOnly": read_only},
                         {"name": "api-key", "mountPath": c.API_KEY_DIR, "readOnly": True}],
    }
    spec: Manifest = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001},
        "containers": [container],
        "volumes": [
            {"name": "archives", "persistentVolumeClaim": {"claimName": claim_name,
                                                          "readOnly": read_only}},
            {"name": "api-key", "secret": {
                "secretName": c.api_key_secret_name(cluster.name), "defaultMode": SECRET_MODE,
                "items": [{"key": c.API_KEYS_FILE, "path": c.API_KEYS_FILE}]}},
        ],
    }
    if cluster.tolerations:
        spec["tolerations"] = [dict(t) for t in cluster.tolerations]
    if cluster.node_selector:
        spec["nodeSelector"] = dict(cluster.node_selector)
    return {"metadata": {"labels": pod_labels(cluster.name, component)}, "spec": spec}


def cronjob(cluster: Cluster, backup: BackupSpec, api_version: str, url: str) -> Manifest:
    """The scheduled export (`api_version`: batch/v1, or batch/v1beta1 before Kubernetes
    1.21). One run at a time; a missed run is not made up later than an hour after its
    time; one retry of a failed run."""
    env = _env(cluster=cluster.name, url=url, backup_dir=BACKUP_DIR, keep=backup.keep)
    return {
        "apiVersion": api_version, "kind": "CronJob",
        "metadata": _job_metadata(cluster, cronjob_name(cluster.name), BACKUP),
        "spec": {
            "schedule": backup.schedule,
            "suspend": backup.suspend,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 3600,
            "successfulJobsHistoryLimit": JOB_HISTORY,
            "failedJobsHistoryLimit": JOB_HISTORY,
            "jobTemplate": {
                "metadata": {"labels": pod_labels(cluster.name, BACKUP)},
                "spec": {"backoffLimit": 1, "template": _pod(
                    cluster, BACKUP, EXPORT_SCRIPT + PRUNE_SCRIPT, env,
                    (backup.claim, BACKUP_DIR, False))},
            },
        },
    }


def restore_job(cluster: Cluster, restore: RestoreSpec, url: str) -> Manifest:
    """The one import into a new cluster; two retries (brokers that just became Ready may
    still be electing their groups), never a second Job for the same archive."""
    env = _env(url=url, restore_dir=RESTORE_DIR, restore_file=restore.file)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _job_metadata(cluster, restore_job_name(cluster.name, restore), RESTORE),
        "spec": {"backoffLimit": 2, "template": _pod(
            cluster, RESTORE, IMPORT_SCRIPT, env, (restore.claim, RESTORE_DIR, True))},
    }
