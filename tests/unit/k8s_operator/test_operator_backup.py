"""Backups and restores without a cluster: cron schedules as a CronJob takes them, the
CronJob and restore Job as rendered, the Job's pruning run for real by `sh` on real files,
and status from pods shaped as kubelet reports a finished container."""

import os
import subprocess
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from mqtt_operator import backup as b
from mqtt_operator import backup_status, cron, metrics
from mqtt_operator import constants as c
from mqtt_operator.manifests import client_service
from mqtt_operator.spec import Cluster
from tests.support.crd import body

DAY = 86400
SUNDAY = date(2026, 12, 6)


@pytest.mark.parametrize(("schedule", "gap"), [
    ("0 3 * * *", DAY),
    ("*/5 * * * *", 300),
    ("@hourly", 3600),
    ("@weekly", 7 * DAY),
    ("0 3 * * MON-FRI", 3 * DAY),  # Friday 03:00 to Monday 03:00
    ("0 0,12 * * *", 12 * 3600),
    ("0 3 1 */3 *", 92 * DAY),  # quarterly: July 1st to October 1st is the longest
    ("0 3 1,15 * 1", 7 * DAY),  # both day fields restricted: either matches (vixie cron)
    ("0 3 15 * *", 31 * DAY),
    ("0 0 29 2 *", (366 + 365 * 3) * DAY),  # leap days: 2028 to 2032
])
def test_a_schedules_longest_gap_is_what_a_backup_may_age_by(schedule: str, gap: int) -> None:
    assert cron.longest_gap(cron.parse(schedule), SUNDAY) == gap


@pytest.mark.parametrize(("schedule", "why"), [
    ("0 3 * *", "4 field(s) where cron wants 5"),
    ("60 3 * * *", "minute: 60 is outside 0-59"),
    ("0 3 * * 7", "day of week: 7 is outside 0-6"),
    ("0 3 * * sunday", "day of week: 'sunday' is not a number or a name"),
    ("*/0 * * * *", "step '0'"),
    ("0 5-1 * * *", "hour: range '5-1' runs backwards"),
    ("0 0 30 2 *", "never runs"),
    ("@every 1h", "unknown descriptor"),
])
def test_a_bad_schedule_is_refused_naming_the_field(schedule: str, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
        cron.parse(schedule)
    problem = b.schedule_problem(b.BackupSpec(schedule, "archive", 7, False))
    assert problem.startswith(f"spec.backup.schedule {schedule!r} is not a cron schedule")
    assert "keeps its last valid schedule" in problem


def _cluster(**spec: Any) -> Cluster:
    return Cluster.from_body(body("web", **spec))


def test_the_cronjob_runs_the_export_in_the_broker_image_off_the_brokers_selector() -> None:
    cluster = _cluster(image="broker:2", backup={"schedule": "0 3 * * *",
                                                 "claimName": "archive"},
                       tolerations=[{"key": "mqtt", "operator": "Exists"}])
    backup = b.BackupSpec.from_spec(cluster.backup)
    assert backup == b.BackupSpec("0 3 * * *", "archive", 7, False)  # the CRD's defaults
    job = b.cronjob(cluster, backup, "batch/v1", "http://10.0.0.7:18083")
    assert job["metadata"]["name"] == "web-backup"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    spec = job["spec"]
    assert (spec["schedule"], spec["suspend"], spec["concurrencyPolicy"]) == (
        "0 3 * * *", False, "Forbid")
    pod = spec["jobTemplate"]["spec"]["template"]
    labels = pod["metadata"]["labels"]
    # Not the brokers' selector: the client Service and the PDB must not count a run.
    assert not c.selector_labels("web").items() <= labels.items()
    assert labels[b.LABEL_COMPONENT] == "backup" and labels[c.LABEL_INSTANCE] == "web"
    container = pod["spec"]["containers"][0]
    assert container["image"] == "broker:2"
    assert container["command"] == ["/bin/sh", "-c", b.EXPORT_SCRIPT + b.PRUNE_SCRIPT]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env == {"MQTT_CLUSTER": "web", "MQTT_URL": "http://10.0.0.7:18083",
                   "MQTT_BACKUP_DIR": "/backups", "MQTT_KEEP": "7",
                   "MQTT_API_KEY_FILE": "/etc/mqtt/api-key/api_keys"}
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["resources"]["limits"]["cpu"] == "500m"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounts == {"archives": "/backups", "api-key": "/etc/mqtt/api-key"}
    assert volumes["archives"]["persistentVolumeClaim"] == {"claimName": "archive",
                                                            "readOnly": False}
    # Only the bootstrap file, whose first key is the administrator's (export's role).
    assert volumes["api-key"]["secret"]["items"] == [{"key": "api_keys", "path": "api_keys"}]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["tolerations"] == [{"key": "mqtt", "operator": "Exists"}]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert b.api_url("fd00::7", cluster) == "http://[fd00::7]:18083"


def test_the_restore_job_is_named_for_its_archive_and_mounts_it_read_only() -> None:
    cluster = _cluster(restoreFrom={"claimName": "archive", "file": "old/web-1.tar"})
    restore = b.RestoreSpec.from_spec(cluster.restore_from)
    assert restore is not None
    job = b.restore_job(cluster, restore, "http://10.0.0.7:18083")
    assert job["metadata"]["name"] == b.restore_job_name("web", restore)
    assert b.restore_job_name("web", b.RestoreSpec("archive", "old/web-2.tar")) != \
        job["metadata"]["name"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert "broker ctl data import" in container["command"][2]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["MQTT_RESTORE_FILE"] == "old/web-1.tar"
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "archive", "readOnly": True}
    assert job["spec"]["template"]["metadata"]["labels"][b.LABEL_COMPONENT] == "restore"


def test_a_withheld_client_service_offers_only_the_http_api() -> None:
    cluster = _cluster()
    assert [p["name"] for p in client_service(cluster, withheld=True)["spec"]["ports"]] == [
        "http"]
    assert {"mqtt", "ws", "http"} <= {p["name"] for p in client_service(cluster)["spec"]["ports"]}


def test_the_jobs_pruning_keeps_the_newest_of_its_own_archives_only(tmp_path: Path) -> None:
    stamps = [f"2026120{day}T030000Z" for day in range(1, 7)]
    ours = [f"web-{stamp}.tar" for stamp in stamps]
    others = [f"web-b-{stamps[0]}.tar", f"other-{stamps[0]}.tar", "web-notes.txt",
              f"web-{stamps[0]}.tar.gz", f"x-web-{stamps[0]}.tar"]
    for name in [*ours, *others]:
        (tmp_path / name).write_bytes(b"archive")
    env = {"PATH": os.environ["PATH"], "MQTT_CLUSTER": "web", "MQTT_KEEP": "2"}
    done = subprocess.run(["/bin/sh", "-c", "set -eu; " + b.PRUNE_SCRIPT], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*ours[-2:], *others])
    # Fewer than keep: nothing goes.
    env["MQTT_KEEP"] = "5"
    subprocess.run(["/bin/sh", "-c", "set -eu; " + b.PRUNE_SCRIPT], cwd=tmp_path, env=env,
                   check=True, timeout=30)
    assert len(list(tmp_path.iterdir())) == 2 + len(others)


def _pod(name: str, component: str, exit_code: int | None, finished: str = "",
         message: str = "", job: str = "web-backup-1") -> dict[str, Any]:
    """A Job's pod as kubelet leaves it: the container's terminated state with the
    termination message (None: still running)."""
    state: dict[str, Any] = {"running": {"startedAt": "2026-12-06T03:00:00Z"}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "startedAt": f"{finished[:11]}03:00:00Z",
                                "finishedAt": finished, "message": message}}
    return {"metadata": {"name": name, "labels": {**b.pod_labels("web", component),
                                                  "job-name": job}},
            "status": {"containerStatuses": [{"name": component, "state": state}]}}


def _export_line(file: str, size: int) -> str:
    return (f'{{"file": "/backups/{file}", "bytes": {size}, "seconds": 1.25,'
            f' "manifest_sha256": "ab"}}\n')


def test_status_records_each_run_once_and_keeps_the_archives_the_job_keeps() -> None:
    spec = b.BackupSpec("0 3 * * *", "archive", 2, False)
    pods = [_pod("a", "backup", 0, "2026-12-04T03:00:09Z", _export_line("web-4.tar", 10)),
            _pod("b", "backup", 0, "2026-12-05T03:00:09Z", _export_line("web-5.tar", 11)),
            _pod("c", "backup", 1, "2026-12-06T03:00:02Z", "error: cannot reach http://x"),
            _pod("d", "backup", None), _pod("e", "restore", 0, "2026-12-06T03:00:03Z")]
    found = backup_status.runs(pods, b.BACKUP)
    assert [run.pod for run in found] == ["a", "b", "c"]
    status, notes = backup_status.backups(None, spec, found, "2026-12-01T00:00:00Z")
    assert status["lastSuccess"] == "2026-12-05T03:00:09Z"
    assert (status["file"], status["size"], status["duration"]) == ("web-5.tar", 11, 1.25)
    assert status["lastFailure"] == "2026-12-06T03:00:02Z"
    assert status["lastFailureMessage"] == "error: cannot reach http://x"
    assert [a["file"] for a in status["archives"]] == ["web-5.tar", "web-4.tar"]
    assert status["since"] == "2026-12-01T00:00:00Z"
    assert [n[1] for n in notes] == ["BackupSucceeded", "BackupSucceeded", "BackupFailed"]
    again, notes = backup_status.backups(status, spec, found, "2026-12-07T00:00:00Z")
    assert (again, notes) == (status, [])  # same pods: nothing new, no Event
    later = [*pods, _pod("f", "backup", 0, "2026-12-07T03:00:08Z",
                         _export_line("web-7.tar", 12))]
    newer, notes = backup_status.backups(again, spec, backup_status.runs(later, b.BACKUP),
                                         "2026-12-07T04:00:00Z")
    assert [a["file"] for a in newer["archives"]] == ["web-7.tar", "web-5.tar"]  # keep 2
    assert newer["lastFailure"] == status["lastFailure"] and len(notes) == 1
    # A success whose line does not parse is still a success, with its time.
    odd, _ = backup_status.backups(None, spec, backup_status.runs(
        [_pod("g", "backup", 0, "2026-12-08T03:00:05Z", "not json")], b.BACKUP), "x")
    assert (odd["lastSuccess"], odd["file"], odd["duration"]) == (
        "2026-12-08T03:00:05Z", None, 5.0)


def _job(condition: str | None) -> dict[str, Any]:
    conditions = [{"type": condition, "status": "True",
                   "lastTransitionTime": "2026-12-06T03:05:00Z"}] if condition else []
    return {"status": {"conditions": conditions}}


def test_a_restore_runs_once_when_ready_and_never_again_after_success() -> None:
    spec = b.RestoreSpec("archive", "web-1.tar")
    name = b.restore_job_name("web", spec)

    def step(record: Any, job: Any = None, ready: bool = True, new: bool = False,
             found: Any = ()) -> backup_status.RestoreStep:
        return backup_status.restore(spec, record, new, job, list(found), ready, name, "T")

    pending = step(None, ready=False, new=True)
    assert (pending.status["state"], pending.create, pending.withheld) == ("Pending", False, True)
    started = step(pending.status)
    assert (started.status["state"], started.create, started.withheld) == ("Running", True, True)
    running = step(started.status, _job(None))
    assert (running.status["state"], running.create) == ("Running", False)
    ok_pod = _pod("r", "restore", 0, "2026-12-06T03:04:00Z", '{"restored": {"sessions": 3}}',
                  job=name)
    done = step(running.status, _job("Complete"), found=backup_status.runs([ok_pod], "restore"))
    assert (done.status["state"], done.withheld, done.status["finished"]) == (
        "Succeeded", False, "2026-12-06T03:05:00Z")
    assert done.status["message"] == '{"restored": {"sessions": 3}}'
    assert done.note is not None and done.note[1] == "RestoreSucceeded"
    # Done: the Job gone or not, the cluster never restores again, nor for another file.
    assert step(done.status).create is False
    other = backup_status.restore(b.RestoreSpec("archive", "web-2.tar"), done.status, False,
                                  None, [], True, "x", "T")
    assert not other.create and "restored from archive/web-1.tar" in other.problem
    # Failed: reported with the import's reason; deleting the Job runs it again.
    bad_pod = _pod("r", "restore", 1, "2026-12-06T03:04:00Z", "409 NOT_EMPTY: holds data",
                   job=name)
    failed = step(running.status, _job("Failed"), found=backup_status.runs([bad_pod], "restore"))
    assert (failed.status["state"], failed.withheld) == ("Failed", True)
    assert failed.note is not None and "NOT_EMPTY" in failed.note[2]
    assert step(failed.status).create is True
    # An existing cluster never restores (it holds data, and clients use it).
    late = step(None, new=False)
    assert (late.create, late.withheld, late.status) == (False, False, None)
    assert "new cluster only" in late.problem


def test_the_backup_gauges_exist_only_while_a_schedule_runs() -> None:
    def sampled() -> set[str]:
        return {sample.name for family in metrics.REGISTRY.collect() for sample in family.samples
                if sample.labels.get("mqttcluster") == "gauged"}

    metrics.report("ns", "gauged", metrics.ClusterState(1, 1, 0, False, (100.0, 3600.0)))
    assert {"mqtt_operator_backup_last_success_timestamp_seconds",
            "mqtt_operator_backup_schedule_interval_seconds"} <= sampled()
    metrics.report("ns", "gauged", metrics.ClusterState(1, 1, 0, False))
    assert "mqtt_operator_backup_schedule_interval_seconds" not in sampled()
    assert "mqtt_operator_cluster_ready_replicas" in sampled()
    metrics.report("ns", "gauged", None)
    assert sampled() == set()


@pytest.mark.parametrize("script", [b.EXPORT_SCRIPT + b.PRUNE_SCRIPT, b.IMPORT_SCRIPT])
def test_the_jobs_scripts_are_valid_posix_shell(script: str) -> None:
    """What runs in the pods parses as `sh` (the export itself needs the brokers:
    tests/k8s_e2e/test_backup.py)."""
    done = subprocess.run(["/bin/sh", "-n", "-c", script], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
