"""spec.backup and spec.restoreFrom against a real API server and controller-manager.

No kubelet here: the CronJob and Job controllers make real Jobs and pods from what the
operator rendered, and the test writes into a pod's status what kubelet would once its
container ended (the termination message of backup.py), as `set_pod_ready` does for
readiness. What the pods run is tested by tests/unit (the pruning) and tests/k8s_e2e."""

import json
import re
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from mqtt_operator import backup as b
from tests.k8s.conftest import (
    Testbed,
    cluster_manifest,
    event_reasons,
    eventually,
    run_operator,
    service_account_kubeconfig,
    set_pod_ready,
)
from tests.k8s.test_helm import CHART, helm

BACKUP = {"schedule": "0 3 * * *", "claimName": "archive", "keep": 3}


@pytest.mark.parametrize(("spec", "field"), [
    ({"backup": {"claimName": "archive"}}, 'missing required field "schedule"'),
    ({"backup": {"schedule": "0 3 * * *", "claimName": "Not_A_Claim"}}, "spec.backup.claimName"),
    ({"backup": {**BACKUP, "keep": 0}}, "spec.backup.keep"),
    ({"restoreFrom": {"claimName": "archive", "file": "../etc/passwd"}}, "spec.restoreFrom.file"),
    ({"restoreFrom": {"claimName": "archive", "file": "/abs.tar"}}, "spec.restoreFrom.file"),
    ({"restoreFrom": {"claimName": "archive"}}, 'missing required field "file"'),
])
def test_the_crd_refuses_bad_backup_and_restore_specs_naming_the_field(
        testbed: Testbed, namespace: str, spec: dict[str, Any], field: str) -> None:
    result = testbed.kubectl("apply", "-n", namespace, "-f", "-", check=False,
                             stdin=yaml.safe_dump(cluster_manifest("bad", **spec)))
    assert result.returncode != 0 and field in result.stderr, result.stderr
    testbed.apply(cluster_manifest("good", backup={"schedule": "@daily", "claimName": "a"},
                                   restoreFrom={"claimName": "a", "file": "x/good-1.tar"}),
                  namespace)
    spec_stored = testbed.get("mqc", "good", namespace)["spec"]
    assert spec_stored["backup"] == {"schedule": "@daily", "claimName": "a", "keep": 7,
                                     "suspend": False}


def _cronjob(testbed: Testbed, namespace: str) -> dict[str, Any] | None:
    return testbed.find("cronjob", "web-backup", namespace)


def _status(testbed: Testbed, namespace: str, name: str) -> dict[str, Any]:
    return dict(testbed.get("mqc", name, namespace).get("status") or {})


def _degraded(testbed: Testbed, namespace: str, name: str) -> dict[str, Any]:
    return next((c for c in _status(testbed, namespace, name).get("conditions") or []
                 if c["type"] == "Degraded"), {})


def _patch(testbed: Testbed, namespace: str, name: str, patch: Any, kind: str = "merge") -> None:
    testbed.kubectl("patch", "mqc", name, "-n", namespace, f"--type={kind}",
                    "-p", json.dumps(patch))


def _finish(testbed: Testbed, namespace: str, pod: str, exit_code: int, message: str,
            finished: str) -> None:
    """What kubelet writes when the container ends: its terminated state with the
    termination message, and the pod's phase, which the Job controller counts."""
    ended = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
             "startedAt": finished[:-3] + "00Z", "finishedAt": finished, "message": message}
    component = testbed.get("pod", pod, namespace)["spec"]["containers"][0]["name"]
    status = {"status": {"phase": "Succeeded" if exit_code == 0 else "Failed",
                         "containerStatuses": [{
                             "name": component, "ready": False, "restartCount": 0,
                             "image": "broker", "imageID": "", "state": {"terminated": ended}}]}}
    testbed.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps(status))


def _run_now(testbed: Testbed, namespace: str, job: str, cluster: str = "web") -> None:
    """A Job from the CronJob's template, as the CronJob controller makes one on schedule
    (the test bed's kubectl is newer than its batch/v1beta1 CronJobs: no `--from`)."""
    template = testbed.get("cronjob", f"{cluster}-backup", namespace)["spec"]["jobTemplate"]
    testbed.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": job, "labels": template["metadata"]["labels"]}, "spec": template["spec"]},
        namespace)


def _job_pod(testbed: Testbed, namespace: str, job: str) -> str:
    """The pod the Job controller made for the Job (no scheduler: it stays Pending)."""
    pods = eventually(lambda: testbed.items("pods", namespace, f"job-name={job}"),
                      what=f"the pod of Job {job}")
    return str(pods[0]["metadata"]["name"])


def _gauge(operator_env: dict[str, str], name: str, cluster: str) -> float | None:
    url = f"http://127.0.0.1:{operator_env['MQTT_OPERATOR_METRICS_PORT']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf'^{name}{{[^}}]*mqttcluster="{cluster}"[^}}]*}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def test_the_cronjob_follows_spec_backup_and_runs_are_recorded_not_pruned(
        testbed: Testbed, namespace: str, operator: Callable[[], Any],
        operator_env: dict[str, str]) -> None:
    with operator():
        testbed.apply(cluster_manifest("web", replicas=1, backup=BACKUP), namespace)
        cronjob = eventually(lambda: _cronjob(testbed, namespace), what="CronJob web-backup")
        cluster = testbed.get("mqc", "web", namespace)
        assert [(o["uid"], o["kind"]) for o in cronjob["metadata"]["ownerReferences"]] == [
            (cluster["metadata"]["uid"], "MQTTCluster")]
        assert cronjob["spec"]["schedule"] == "0 3 * * *"
        container = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
        env = {item["name"]: item["value"] for item in container["env"]}
        ip = testbed.get("service", "web", namespace)["spec"]["clusterIP"]
        assert env["MQTT_URL"] == f"http://{ip}:18083" and env["MQTT_KEEP"] == "3"
        assert "broker ctl data export" in container["command"][2]

        # A run, made from the CronJob by its own template, as the CronJob controller would.
        _run_now(testbed, namespace, "web-backup-1")
        pod = _job_pod(testbed, namespace, "web-backup-1")
        line = {"file": "/backups/web-20261206T030000Z.tar", "bytes": 4096, "seconds": 2.5,
                "manifest_sha256": "00"}
        _finish(testbed, namespace, pod, 0, json.dumps(line), "2026-12-06T03:00:05Z")
        record = eventually(lambda: _status(testbed, namespace, "web").get("backups", {}).get(
            "lastSuccess") and _status(testbed, namespace, "web")["backups"],
            what="the run in status.backups")
        assert (record["file"], record["size"], record["duration"]) == (
            "web-20261206T030000Z.tar", 4096, 2.5)
        assert [a["file"] for a in record["archives"]] == ["web-20261206T030000Z.tar"]
        assert eventually(lambda: _gauge(
            operator_env, "mqtt_operator_backup_last_success_timestamp_seconds", "web")) == \
            1796526005.0
        assert _gauge(operator_env, "mqtt_operator_backup_schedule_interval_seconds",
                      "web") == 86400.0

        _run_now(testbed, namespace, "web-backup-2")
        failing = _job_pod(testbed, namespace, "web-backup-2")
        _finish(testbed, namespace, failing, 1, "broker ctl: cannot reach http://x: refused",
                "2026-12-06T04:00:03Z")
        failed = eventually(lambda: _status(testbed, namespace, "web")["backups"].get(
            "lastFailure") and _status(testbed, namespace, "web")["backups"])
        assert failed["lastFailureMessage"] == "broker ctl: cannot reach http://x: refused"
        assert failed["lastSuccess"] == "2026-12-06T03:00:05Z"
        assert {"BackupSucceeded", "BackupFailed"} <= set(event_reasons(testbed, namespace, "web"))
        # The operator prunes nothing: runs and their pods are the CronJob's history to keep
        # (beside them, the failed run's retry: backoffLimit 1).
        assert {p["metadata"]["name"] for p in testbed.items(
            "pods", namespace, "app.kubernetes.io/name=mqtt-backup")} >= {pod, failing}

        # Edits reach the CronJob; a schedule the API server would refuse does not.
        _patch(testbed, namespace, "web", {"spec": {"backup": {"schedule": "*/5 * * * *",
                                                               "suspend": True}}})
        eventually(lambda: (j := _cronjob(testbed, namespace)) and j["spec"]["schedule"] ==
                   "*/5 * * * *" and j["spec"]["suspend"], what="the new schedule, suspended")
        eventually(lambda: _gauge(operator_env, "mqtt_operator_backup_schedule_interval_seconds",
                                  "web") is None, what="no gauge while suspended")
        _patch(testbed, namespace, "web", {"spec": {"backup": {"schedule": "0 3 * *"}}})
        degraded = eventually(lambda: "spec.backup.schedule" in _degraded(
            testbed, namespace, "web").get("message", "") and _degraded(testbed, namespace, "web"))
        assert degraded["status"] == "True" and "4 field(s)" in degraded["message"]
        assert _cronjob(testbed, namespace)["spec"]["schedule"] == "*/5 * * * *"

        # No backup section: no CronJob; the record of the archives stays.
        _patch(testbed, namespace, "web", [{"op": "remove", "path": "/spec/backup"}], "json")
        eventually(lambda: _cronjob(testbed, namespace) is None, what="CronJob deleted")
        assert _degraded(testbed, namespace, "web")["status"] == "False"
        assert _status(testbed, namespace, "web")["backups"]["archives"] == record["archives"]
        assert "BackupsStopped" in event_reasons(testbed, namespace, "web")

        # Deleting the cluster collects its CronJob.
        _patch(testbed, namespace, "web", {"spec": {"backup": BACKUP}})
        eventually(lambda: _cronjob(testbed, namespace), what="CronJob again")
        testbed.kubectl("delete", "mqc", "web", "-n", namespace)
        eventually(lambda: _cronjob(testbed, namespace) is None, what="CronJob collected")
        # ... and its gauges go (the reconcile after its broker pod is collected).
        eventually(lambda: _gauge(operator_env, "mqtt_operator_cluster_spec_replicas", "web")
                   is None, what="the gauges of a deleted cluster gone")


def _ports(testbed: Testbed, namespace: str, name: str) -> list[str]:
    return [p["name"] for p in testbed.get("service", name, namespace)["spec"]["ports"]]


def test_a_new_cluster_restores_once_when_ready_and_opens_to_clients_after(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    source = {"claimName": "archive", "file": "web-20261206T030000Z.tar"}
    job = b.restore_job_name("fresh", b.RestoreSpec(source["claimName"], source["file"]))
    with operator():
        testbed.apply(cluster_manifest("fresh", replicas=2, restoreFrom=source), namespace)
        eventually(lambda: _status(testbed, namespace, "fresh").get("restore", {}).get(
            "state") == "Pending", what="restore pending")
        assert _ports(testbed, namespace, "fresh") == ["http"]  # clients kept out
        assert testbed.find("job", job, namespace) is None  # brokers not Ready yet
        for ordinal in range(2):
            eventually(lambda o=ordinal: testbed.find("pod", f"fresh-{o}", namespace))
            set_pod_ready(testbed, namespace, f"fresh-{ordinal}")
        created = eventually(lambda: testbed.find("job", job, namespace), what="restore Job")
        container = created["spec"]["template"]["spec"]["containers"][0]
        env = {item["name"]: item["value"] for item in container["env"]}
        ip = testbed.get("service", "fresh", namespace)["spec"]["clusterIP"]
        assert env["MQTT_URL"] == f"http://{ip}:18083"
        assert env["MQTT_RESTORE_FILE"] == source["file"]
        assert _status(testbed, namespace, "fresh")["restore"]["state"] == "Running"

        pod = _job_pod(testbed, namespace, job)
        _finish(testbed, namespace, pod, 0, '{"restored": {"sessions": 2}}',
                "2026-12-06T05:00:09Z")
        restored = eventually(lambda: (r := _status(testbed, namespace, "fresh")["restore"])[
            "state"] == "Succeeded" and r, what="restore succeeded")
        assert restored["message"] == '{"restored": {"sessions": 2}}' and restored["finished"]
        eventually(lambda: "mqtt" in _ports(testbed, namespace, "fresh"), what="MQTT open")
        assert {"RestoreStarted", "RestoreSucceeded"} <= set(event_reasons(
            testbed, namespace, "fresh"))

        # Never again: not when its Job is gone, not for another file.
        testbed.kubectl("delete", "job", job, "-n", namespace)
        _patch(testbed, namespace, "fresh", {"spec": {"restoreFrom": {"file": "other.tar"}}})
        eventually(lambda: "restored from archive/" in _degraded(
            testbed, namespace, "fresh").get("message", ""), what="the edit reported")
        set_pod_ready(testbed, namespace, "fresh-1", ready=False)  # more reconciles
        set_pod_ready(testbed, namespace, "fresh-1")
        eventually(lambda: _status(testbed, namespace, "fresh")["readyReplicas"] == 2)
        assert [j["metadata"]["name"] for j in testbed.items("jobs", namespace)] == []
        assert "mqtt" in _ports(testbed, namespace, "fresh")


def test_a_failed_restore_is_reported_and_an_existing_cluster_is_never_restored(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    source = {"claimName": "archive", "file": "web-1.tar"}
    job = b.restore_job_name("fresh", b.RestoreSpec(source["claimName"], source["file"]))
    with operator():
        testbed.apply(cluster_manifest("fresh", replicas=1, restoreFrom=source), namespace)
        testbed.apply(cluster_manifest("used", replicas=1), namespace)
        eventually(lambda: testbed.find("pod", "fresh-0", namespace))
        set_pod_ready(testbed, namespace, "fresh-0")
        pod = _job_pod(testbed, namespace, job)
        # The Job retries (backoffLimit 2): each attempt's pod fails the same way.
        for attempt in range(3):
            _finish(testbed, namespace, pod, 1, "409 NOT_EMPTY: the cluster holds data",
                    f"2026-12-06T05:0{attempt}:09Z")
            if attempt < 2:
                pod = eventually(lambda done=pod: next((
                    p["metadata"]["name"] for p in testbed.items(
                        "pods", namespace, f"job-name={job}")
                    if p["metadata"]["name"] != done and not p["status"].get(
                        "containerStatuses")), None), what="the next attempt")
        # The Job controller marks the Job Failed after its back-off (10 s, 20 s, ...).
        failed = eventually(lambda: (r := _status(testbed, namespace, "fresh")["restore"])[
            "state"] == "Failed" and r, timeout=120, what="restore failed")
        assert "NOT_EMPTY" in failed["message"]
        assert _ports(testbed, namespace, "fresh") == ["http"]
        assert "RestoreFailed" in event_reasons(testbed, namespace, "fresh")
        # Deleting the failed Job tries again.
        testbed.kubectl("delete", "job", job, "-n", namespace)
        eventually(lambda: (j := testbed.find("job", job, namespace)) and not j.get(
            "status", {}).get("failed"), what="a new restore Job")

        # A cluster that has been running: restoreFrom is refused, clients keep their ports.
        eventually(lambda: _status(testbed, namespace, "used").get("phase"))
        _patch(testbed, namespace, "used", {"spec": {"restoreFrom": source}})
        eventually(lambda: "new cluster only" in _degraded(testbed, namespace, "used").get(
            "message", ""), what="restoreFrom refused")
        assert "mqtt" in _ports(testbed, namespace, "used")
        assert testbed.find("job", b.restore_job_name(
            "used", b.RestoreSpec(source["claimName"], source["file"])), namespace) is None


def test_kubectl_mqtt_backups_lists_the_record_and_the_schedule(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    with operator():
        # Not "web": the operator's gauges of a cluster left behind outlive the test.
        testbed.apply(cluster_manifest("shop", replicas=1, backup=BACKUP), namespace)
        eventually(lambda: testbed.find("cronjob", "shop-backup", namespace))
        _run_now(testbed, namespace, "shop-backup-1", "shop")
        line = {"file": "/backups/shop-20261206T030000Z.tar", "bytes": 4096, "seconds": 2.5}
        _finish(testbed, namespace, _job_pod(testbed, namespace, "shop-backup-1"), 0,
                json.dumps(line), "2026-12-06T03:00:05Z")
        eventually(lambda: _status(testbed, namespace, "shop").get("backups", {}).get(
            "archives"), what="an archive on record")

    def mqtt(*args: str) -> subprocess.CompletedProcess[str]:
        return testbed.kubectl("mqtt", "backups", "shop", "-n", namespace, *args, check=False)

    text = mqtt()
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "SCHEDULE: 0 3 * * * (CronJob shop-backup)"
    assert lines[1].startswith("LAST RUN: ") and lines[2] == "CLAIM: archive"
    assert lines[3] == "LAST SUCCESS: 2026-12-06T03:00:05Z shop-20261206T030000Z.tar"
    table = lines[lines.index("ARCHIVES:") + 1:]
    assert table[0].split() == ["FILE", "BYTES", "SECONDS", "FINISHED"]
    assert table[1].split() == ["shop-20261206T030000Z.tar", "4096", "2.5",
                                "2026-12-06T03:00:05Z"]
    document = json.loads(mqtt("-o", "json").stdout)
    assert document["cronJob"]["schedule"] == "0 3 * * *" and not document["cronJob"]["suspend"]
    assert document["backups"]["archives"][0]["size"] == 4096
    assert document["restore"] is None


def test_the_charts_rbac_suffices_for_backups_and_a_restore(
        testbed: Testbed, namespace: str, operator_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator as the chart's ServiceAccount: the CronJob (its version found by
    discovery), the Jobs' pods listed and watched, the restore Job created and read."""
    helm(testbed, "install", "rel", str(CHART), "--namespace", namespace,
         "--set", "cluster.replicas=1", "--set", "cluster.backup.schedule=@daily",
         "--set", "cluster.backup.claimName=archive",
         "--set", "cluster.restoreFrom.claimName=archive",
         "--set", "cluster.restoreFrom.file=rel-20261206T030000Z.tar")
    kubeconfig = service_account_kubeconfig(testbed, namespace, "rel-operator",
                                            tmp_path / "operator.kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    job = b.restore_job_name("rel", b.RestoreSpec("archive", "rel-20261206T030000Z.tar"))
    with run_operator(namespace) as runner:
        cronjob = eventually(lambda: testbed.find("cronjob", "rel-backup", namespace))
        assert cronjob["spec"]["schedule"] == "@daily"
        eventually(lambda: testbed.find("pod", "rel-0", namespace))
        set_pod_ready(testbed, namespace, "rel-0")
        eventually(lambda: testbed.find("job", job, namespace), what="the restore Job")
        eventually(lambda: _status(testbed, namespace, "rel").get("restore", {}).get(
            "state") == "Running")
    assert "Forbidden" not in runner.output, runner.output  # the chart's RBAC sufficed
    assert "failed with an exception" not in runner.output, runner.output
    helm(testbed, "uninstall", "rel", "--namespace", namespace, "--wait")
