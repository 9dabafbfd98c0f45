"""status.backups and status.restore, from what the Jobs' pods reported (backup.py says how:
their termination messages).

Pure and level-based: every reconcile derives the status from the previous one and the
finished pods that still exist (a CronJob keeps its last few Jobs), so a record is never
lost to an operator restart and never counted twice (runs are told apart by their finish
time, later than the last one on record).
"""

import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mqtt_operator import backup as b

_MESSAGE_LIMIT = 1024  # of a failure's message kept in status (kubelet keeps up to 4 KiB)
Note = tuple[str, str, str]  # an Event: (Normal | Warning, reason, message)


@dataclass(frozen=True)
class Run:
    """One finished attempt of a Job: its pod's container's terminated state."""

    pod: str
    job: str
    succeeded: bool
    started: str
    finished: str  # RFC3339 (kubelet's, UTC, seconds): ordered as text
    message: str


def runs(pods: Sequence[Mapping[str, Any]], component: str) -> list[Run]:
    """The finished attempts among the pods of one component (backup | restore), oldest
    first."""
    found = []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if labels.get(b.LABEL_COMPONENT) != component:
            continue
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            ended = (container.get("state") or {}).get("terminated")
            if container.get("name") == component and ended and ended.get("finishedAt"):
                found.append(Run(pod["metadata"]["name"], labels.get("job-name", ""),
                                 ended.get("exitCode") == 0, ended.get("startedAt") or "",
                                 ended["finishedAt"], (ended.get("message") or "").strip()))
    return sorted(found, key=lambda run: run.finished)


def _seconds_between(start: str, end: str) -> float | None:
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return None


def archive(run: Run) -> dict[str, Any]:
    """What a successful export wrote, from its JSON line (`broker ctl data export -o
    json`: file, bytes, seconds); a line that does not parse still leaves the time."""
    try:
        line = json.loads(run.message.splitlines()[-1])
        line = line if isinstance(line, dict) else {}
    except (ValueError, IndexError):
        line = {}
    size, seconds = line.get("bytes"), line.get("seconds")
    return {"file": posixpath.basename(str(line.get("file") or "")) or None,
            "size": size if isinstance(size, int) else None,
            "duration": round(seconds, 3) if isinstance(seconds, int | float)
            else _seconds_between(run.started, run.finished),
            "finished": run.finished}


def backups(previous: Mapping[str, Any] | None, spec: b.BackupSpec | None,
            found: Sequence[Run], now: str) -> tuple[dict[str, Any], list[Note]]:
    """status.backups and the Events for runs new since the previous status. `since`: when
    the schedule was first seen, the age a backup is measured from before the first
    success. Without a spec the record stays (its archives are still on the claim)."""
    old = dict(previous or {})
    last_success, last_failure = old.get("lastSuccess") or "", old.get("lastFailure") or ""
    fresh = [run for run in found if run.succeeded and run.finished > last_success]
    failed = [run for run in found if not run.succeeded and run.finished > last_failure]
    notes: list[Note] = []
    written = [archive(run) for run in fresh]
    for entry in written:
        notes.append(("Normal", "BackupSucceeded", f"{entry['file']}: {entry['size']} bytes"
                      f" in {entry['duration']} s"))
    record = {**old, "schedule": spec.schedule if spec else None,
              "claimName": spec.claim if spec else old.get("claimName"),
              "suspended": spec.suspend if spec else None,
              "since": old.get("since") or (now if spec else None)}
    if written:
        newest = written[-1]
        record.update(lastSuccess=newest["finished"], file=newest["file"],
                      size=newest["size"], duration=newest["duration"])
        kept = {entry["file"]: entry for entry in [*(old.get("archives") or []), *written]
                if entry["file"]}
        keep = spec.keep if spec else len(kept)
        record["archives"] = sorted(kept.values(), key=lambda entry: entry["finished"],
                                    reverse=True)[:keep]
    if failed:
        newest_failure = failed[-1]
        message = newest_failure.message[-_MESSAGE_LIMIT:] or "no output"
        record.update(lastFailure=newest_failure.finished, lastFailureMessage=message)
        notes.append(("Warning", "BackupFailed", f"{newest_failure.pod}: {message}"))
    return record, notes


@dataclass(frozen=True)
class RestoreStep:
    status: dict[str, Any] | None  # status.restore
    create: bool  # the restore Job is to be created now
    withheld: bool  # the clients' ports stay off the client Service
    problem: str  # a spec the operator ignores, for the Degraded condition
    note: Note | None = None


def _job_outcome(job: Mapping[str, Any]) -> tuple[str, str]:
    """(Succeeded | Failed | Running, when it ended)."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete",
                                                                            "Failed"):
            state = "Succeeded" if condition["type"] == "Complete" else "Failed"
            return state, condition.get("lastTransitionTime") or ""
    return "Running", ""


def restore(spec: b.RestoreSpec | None, record: Mapping[str, Any] | None, new_cluster: bool,
            job: Mapping[str, Any] | None, found: Sequence[Run], ready: bool,
            job_name: str, now: str) -> RestoreStep:
    """The restore's next step. A restore is for a new cluster only (one whose first
    reconcile saw spec.restoreFrom), runs once all brokers are Ready, and once it has
    succeeded never again; a failed one runs again when its Job is deleted (or the spec
    names another archive). Until it succeeds the clients' ports are withheld."""
    record = dict(record) if record else None
    if spec is None:
        return RestoreStep(record, False, False, "")
    source = {"claimName": spec.claim, "file": spec.file}
    if record is None and not new_cluster:
        return RestoreStep(None, False, False, (
            "spec.restoreFrom restores a new cluster only, and this one was created without"
            " it: ignored"))
    if record is not None and record.get("state") == "Succeeded":
        same = {k: record.get(k) for k in source} == source
        return RestoreStep(record, False, False, "" if same else (
            f"spec.restoreFrom names {spec.claim}/{spec.file}, but the cluster was restored"
            f" from {record.get('claimName')}/{record.get('file')} at {record.get('finished')}:"
            f" ignored"))
    if job is None:
        if not ready:
            return RestoreStep({**source, "state": "Pending", "job": job_name,
                                "message": "waiting for every broker to be Ready"},
                               False, True, "")
        return RestoreStep({**source, "state": "Running", "job": job_name, "started": now,
                            "message": f"importing {spec.file}"}, True, True, "",
                           ("Normal", "RestoreStarted", f"Job {job_name} imports"
                            f" {spec.claim}/{spec.file}"))
    state, ended = _job_outcome(job)
    attempts = [run for run in found if run.job == job_name]
    last = next((run for run in reversed(attempts) if run.succeeded == (state != "Failed")),
                None)
    message = (last.message[-_MESSAGE_LIMIT:] if last else "") or {
        "Succeeded": "imported", "Failed": "the Job failed", "Running": "importing"}[state]
    status = {**source, "state": state, "job": job_name,
              "started": (record or {}).get("started") or now,
              "finished": ended or None, "message": message}
    note = None
    if state != "Running" and (record or {}).get("state") != state:
        note = (("Normal", "RestoreSucceeded", f"{spec.claim}/{spec.file}: {message}")
                if state == "Succeeded" else
                ("Warning", "RestoreFailed", f"{spec.claim}/{spec.file}: {message}; delete"
                 f" Job {job_name} to try again"))
    return RestoreStep(status, False, state != "Succeeded", "", note)
