"""The backup and restore steps of a reconcile: read the Jobs' pods, apply the CronJob or
create the restore Job, say what the status becomes. The decisions are backup_status.py's
and the objects backup.py's; this is the I/O between them."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mqtt_operator import backup as b
from mqtt_operator import backup_status, cron
from mqtt_operator import constants as c
from mqtt_operator.kube import Kube, path
from mqtt_operator.spec import Cluster

Emit = Callable[[str, str, str], None]


@dataclass(frozen=True)
class BackupOutcome:
    status: dict[str, Any] | None  # status.backups
    problem: str  # for the Degraded condition ("" when none)
    # (epoch seconds the backups are fresh as of, the schedule's longest gap in seconds)
    # for the staleness alert; None without a schedule, or suspended
    freshness: tuple[float, float] | None


def job_pods(kube: Kube, cluster: Cluster) -> list[dict[str, Any]]:
    return kube.list("v1", "Pod", cluster.namespace, {c.LABEL_NAME: b.APP_NAME,
                                                      c.LABEL_INSTANCE: cluster.name})


def cronjob_version(kube: Kube) -> str:
    """batch/v1 where served (Kubernetes 1.21 on), else batch/v1beta1."""
    return "batch/v1" if kube.serves("batch/v1", "cronjobs") else "batch/v1beta1"


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def reconcile_backups(kube: Kube, cluster: Cluster, spec: b.BackupSpec | None,
                      previous: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]],
                      url: str | None, emit: Emit, now: str) -> BackupOutcome:
    """Applies the CronJob (deletes it once the spec drops it) and records the runs. A
    schedule the API server would refuse is reported and not applied: the CronJob keeps
    its last valid one. Pruning is the Job's own (backup.PRUNE_SCRIPT), never the
    operator's."""
    name = b.cronjob_name(cluster.name)
    problem = b.schedule_problem(spec) if spec else ""
    if spec is None:
        if previous and previous.get("schedule"):
            kube.delete(path(cronjob_version(kube), "CronJob", cluster.namespace, name))
            emit("Normal", "BackupsStopped", f"spec.backup removed: CronJob {name} deleted;"
                 f" the archives stay on claim {previous.get('claimName')}")
    elif not problem and url:
        kube.apply(b.cronjob(cluster, spec, cronjob_version(kube), url))
    if not previous and spec is None:
        return BackupOutcome(None, "", None)
    status, notes = backup_status.backups(
        previous, spec, backup_status.runs(pods, b.BACKUP), now)
    for note in notes:
        emit(*note)
    freshness = None
    if spec and not spec.suspend and not problem:
        fresh_as_of = status.get("lastSuccess") or status["since"]
        gap = cron.longest_gap(cron.parse(spec.schedule), datetime.now(UTC).date())
        freshness = (_epoch(fresh_as_of), float(gap))
    return BackupOutcome(status, problem, freshness)


def reconcile_restore(kube: Kube, cluster: Cluster, spec: b.RestoreSpec | None,
                      record: Mapping[str, Any] | None, new_cluster: bool,
                      pods: Sequence[Mapping[str, Any]], ready: bool, url: str | None,
                      emit: Emit, now: str) -> backup_status.RestoreStep:
    """Creates the restore Job once every broker is Ready (and the client Service has its
    address), and reads how it went."""
    if spec is None:
        return backup_status.restore(None, record, new_cluster, None, [], ready, "", now)
    name = b.restore_job_name(cluster.name, spec)
    job = kube.get(path("batch/v1", "Job", cluster.namespace, name))
    step = backup_status.restore(spec, record, new_cluster, job,
                                 backup_status.runs(pods, b.RESTORE), ready and bool(url),
                                 name, now)
    if step.create and url:
        kube.create(b.restore_job(cluster, spec, url))
    if step.note:
        emit(*step.note)
    return step
