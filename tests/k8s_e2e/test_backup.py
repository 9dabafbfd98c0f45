"""Backups and a restore with real pods: the chart's CronJob exports a release with durable
state into a claim on its schedule (the real broker image's `broker ctl data export`),
prunes to `keep`, and a fresh MQTTCluster created from the archive resumes the durable
session (its queued messages) and the retained message. Contract section 7."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import Testbed, cluster_manifest, eventually
from tests.k8s_e2e.cluster import (
    describe,
    install,
    mosquitto,
    secret_value,
    service_ip,
    wait_brokers,
)

SESSION = ("-c", "-i", "e2e-backup-durable", "-x", "3600", "-q", "1")
MESSAGES = [f"queued-{n}" for n in range(5)]


def _login(node: Testbed, namespace: str, cluster: str) -> tuple[str, ...]:
    return ("-u", secret_value(node, namespace, f"{cluster}-mqtt-user", "username"),
            "-P", secret_value(node, namespace, f"{cluster}-mqtt-user", "password"))


def _status(node: Testbed, namespace: str, name: str) -> dict[str, Any]:
    return dict(node.get("mqc", name, namespace).get("status") or {})


def _claim_dir(node: Testbed, namespace: str, claim: str) -> Path:
    """The hostPath of the PersistentVolume the claim is bound to: the node is this host."""
    volume = eventually(lambda: node.get("pvc", claim, namespace)["spec"].get("volumeName"),
                        what=f"claim {claim} bound")
    return Path(node.kubectl("get", "pv", volume, "-o", "jsonpath={.spec.hostPath.path}").stdout)


def _archives(directory: Path, cluster: str) -> list[str]:
    return sorted(p.name for p in directory.glob(f"{cluster}-*.tar"))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_scheduled_export_restores_a_fresh_cluster_with_its_sessions(
        node: Testbed, release: tuple[str, str]) -> None:
    namespace, name = release
    node.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "archive"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}}, namespace)
    install(node, namespace, name, "cluster.replicas=1", "cluster.backup.schedule=* * * * *",
            "cluster.backup.claimName=archive", "cluster.backup.keep=1")
    wait_brokers(node, namespace, name, 1)
    host, login = service_ip(node, namespace, name), _login(node, namespace, name)
    # A durable session with a subscription, away while messages queue for it, and a
    # retained message: the durable state the archive must carry.
    mosquitto("mosquitto_sub", host, *login, *SESSION, "-t", "e2e/backup/#", "-E")
    for message in MESSAGES:
        mosquitto("mosquitto_pub", host, *login, "-q", "1", "-t", f"e2e/backup/{message}",
                  "-m", message)
    mosquitto("mosquitto_pub", host, *login, "-q", "1", "-r", "-t", "e2e/retained",
              "-m", "kept")

    def success_after(earlier: str) -> dict[str, Any] | None:
        record = _status(node, namespace, name).get("backups") or {}
        return record if (record.get("lastSuccess") or "") > earlier else None

    try:
        first = eventually(lambda: success_after(""), timeout=240, what="a scheduled export")
        second = eventually(lambda: success_after(first["lastSuccess"]), timeout=240,
                            what="the next export")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{describe(node, namespace)}") from error
    # Stop the schedule, and let a run already started finish, before looking at the claim.
    node.kubectl("patch", "mqc", name, "-n", namespace, "--type=merge",
                 "-p", json.dumps({"spec": {"backup": {"suspend": True}}}))
    eventually(lambda: (j := node.get("cronjob", f"{name}-backup", namespace))["spec"][
        "suspend"] and not j.get("status", {}).get("active"), timeout=120,
        what="the CronJob suspended, no run active")
    directory = _claim_dir(node, namespace, "archive")

    def settled() -> dict[str, Any] | None:
        record = _status(node, namespace, name)["backups"]
        return record if _archives(directory, name) == [record["file"]] else None

    # keep 1: each run pruned the archive before it, and only that one.
    last = eventually(settled, timeout=60, what="one archive on the claim, the last recorded")
    assert last["lastSuccess"] >= second["lastSuccess"] > first["lastSuccess"]
    assert (directory / last["file"]).stat().st_size == last["size"] > 0
    assert [a["file"] for a in last["archives"]] == [last["file"]]
    verified = subprocess.run(
        [sys.executable, "-m", "broker", "ctl", "data", "verify", str(directory / last["file"])],
        capture_output=True, text=True, timeout=120, check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # A fresh cluster from the archive, in the same namespace (the claim is namespaced).
    spec = node.get("mqc", name, namespace)["spec"]
    node.apply(cluster_manifest("fresh", replicas=1, image=spec["image"],
                                imagePullPolicy=spec["imagePullPolicy"], restoreFrom={
                                    "claimName": "archive", "file": last["file"]}), namespace)
    try:
        restored = eventually(lambda: (r := _status(node, namespace, "fresh").get(
            "restore") or {}).get("state") in ("Succeeded", "Failed") and r, timeout=400,
            what="the restore")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{describe(node, namespace)}") from error
    assert restored["state"] == "Succeeded", restored
    eventually(lambda: "mqtt" in [p["name"] for p in node.get(
        "service", "fresh", namespace)["spec"]["ports"]], what="MQTT on the fresh Service")
    fresh_host, fresh_login = service_ip(node, namespace, "fresh"), _login(
        node, namespace, "fresh")
    got = mosquitto("mosquitto_sub", fresh_host, *fresh_login, *SESSION, "-t", "e2e/backup/#",
                    "-C", str(len(MESSAGES)), "-W", "60")
    assert sorted(got.split()) == sorted(MESSAGES)  # queued for the session before the cut
    retained = mosquitto("mosquitto_sub", fresh_host, *fresh_login, "-t", "e2e/retained",
                         "-C", "1", "-W", "30")
    assert retained.strip() == "kept"
