"""`kubectl mqtt backups`: a cluster's archives on record (status.backups, status.restore)
and its CronJob's schedule and last runs, as the API server has them (no broker asked)."""

import json
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from mqtt_operator import backup as b
from mqtt_operator.kube import Kube, path
from mqtt_operator.plugin_ask import refused, table

_VERSIONS = ("batch/v1", "batch/v1beta1")  # CronJob's, newest first (v1 from 1.21)


def cronjob(kube: Kube, namespace: str, cluster: str) -> dict[str, Any] | None:
    """The cluster's backup CronJob, in whichever version the API server serves."""
    name = b.cronjob_name(cluster)
    for version in _VERSIONS:
        try:
            found = kube.get(path(version, "CronJob", namespace, name))
        except ApiException as error:
            raise refused(error, f"CronJob {namespace}/{name}",
                          f"get cronjobs -n {namespace}") from None
        if found is not None:
            return dict(found)
    return None


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _schedule_lines(record: Mapping[str, Any], job: Mapping[str, Any] | None) -> list[str]:
    if job is None:
        return ["SCHEDULE: none (no spec.backup)" if not record.get("schedule") else
                f"SCHEDULE: {record['schedule']} (its CronJob does not exist yet)"]
    spec, state = job.get("spec") or {}, job.get("status") or {}
    return [f"SCHEDULE: {spec.get('schedule')} (CronJob {job['metadata']['name']}"
            + (", suspended" if spec.get("suspend") else "") + ")",
            f"LAST RUN: {_cell(state.get('lastScheduleTime'))}"
            + (f" (running: {len(state['active'])})" if state.get("active") else ""),
            f"CLAIM: {_cell(record.get('claimName'))}"]


def render_backups(body: Mapping[str, Any], job: Mapping[str, Any] | None) -> str:
    status = body.get("status") or {}
    record, restore = status.get("backups") or {}, status.get("restore")
    lines = _schedule_lines(record, job)
    lines.append(f"LAST SUCCESS: {_cell(record.get('lastSuccess'))}"
                 + (f" {record['file']}" if record.get("file") else ""))
    if record.get("lastFailure"):
        lines.append(f"LAST FAILURE: {record['lastFailure']}:"
                     f" {record.get('lastFailureMessage') or ''}".rstrip())
    archives = record.get("archives") or []
    rows = [("FILE", "BYTES", "SECONDS", "FINISHED")] + [
        (_cell(a.get("file")), _cell(a.get("size")), _cell(a.get("duration")),
         _cell(a.get("finished"))) for a in archives]
    lines += ["", "ARCHIVES:", *(table(rows) if archives else ["(none on record)"])]
    if restore:
        lines += ["", f"RESTORE: {restore.get('state')} from {restore.get('claimName')}/"
                      f"{restore.get('file')} (Job {restore.get('job')}, finished"
                      f" {_cell(restore.get('finished'))}): {restore.get('message') or ''}"
                  .rstrip()]
    return "\n".join(lines) + "\n"


def backups_json(body: Mapping[str, Any], job: Mapping[str, Any] | None) -> str:
    status = body.get("status") or {}
    spec, state = (job or {}).get("spec") or {}, (job or {}).get("status") or {}
    return json.dumps({
        "cluster": body["metadata"]["name"], "namespace": body["metadata"]["namespace"],
        "backups": status.get("backups") or {}, "restore": status.get("restore"),
        "cronJob": None if job is None else {
            "name": job["metadata"]["name"], "schedule": spec.get("schedule"),
            "suspend": bool(spec.get("suspend")),
            "lastScheduleTime": state.get("lastScheduleTime"),
            "lastSuccessfulTime": state.get("lastSuccessfulTime"),
            "active": len(state.get("active") or [])},
    }, indent=2, sort_keys=True) + "\n"
