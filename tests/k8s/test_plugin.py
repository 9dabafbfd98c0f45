"""`kubectl mqtt` run through the real kubectl (plugin found on PATH) against the test bed."""

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.k8s.conftest import (
    Testbed,
    cluster_manifest,
    eventually,
    service_account_kubeconfig,
    set_pod_ready,
)


def mqtt(testbed: Testbed, *args: str, kubeconfig: Path | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = {"KUBECONFIG": str(kubeconfig)} if kubeconfig else None
    return testbed.kubectl("mqtt", *args, check=False, env=env)


def test_sites_and_shards_text_and_json(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    with operator():
        testbed.apply(cluster_manifest("web", replicas=3, durableStorage={"nShards": 4}),
                      namespace)
        status = eventually(lambda: testbed.get("mqc", "web", namespace).get("status", {}).get(
            "placement") and testbed.get("mqc", "web", namespace)["status"])
        ids = [status["siteIds"][str(o)] for o in range(3)]
        eventually(lambda: testbed.find("pod", "web-1", namespace))
        set_pod_ready(testbed, namespace, "web-1")
        eventually(lambda: [s["state"] for s in testbed.get("mqc", "web", namespace)[
            "status"]["sites"]] == ["down", "up", "down"])

    text = mqtt(testbed, "sites", "web", "-n", namespace)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "SITES:"
    assert lines[1].split() == [ids[0], "web-0", "down"]
    assert lines[2].split() == [ids[1], "web-1", "up"]
    assert "SHARDS:" in lines and "REPLICA TRANSITIONS:" in lines
    shard_rows = [line.split() for line in lines if line.startswith("messages/")]
    assert [row[0] for row in shard_rows][:4] == [f"messages/{n}" for n in range(4)]
    assert all(len(row) == 4 and set(row[1:]) == set(ids) for row in shard_rows[:4])

    as_json = json.loads(mqtt(testbed, "sites", "web", "-o", "json", "-n", namespace).stdout)
    assert [s["id"] for s in as_json["sites"]] == ids
    assert as_json["namespace"] == namespace and as_json["drain"] is None

    shards = mqtt(testbed, "shards", "web", "-n", namespace, "-o", "json")
    document = json.loads(shards.stdout)
    assert sorted(document["placement"]["shards"], key=int) == ["0", "1", "2", "3"]
    assert document["placement"]["loads"] == dict.fromkeys(ids, 4)
    shards_text = mqtt(testbed, "shards", "web", "-n", namespace).stdout
    assert "REPLICAS PER SITE:" in shards_text and f"{ids[2]}  4" in shards_text


def test_missing_cluster_and_no_access_are_clear_errors(
        testbed: Testbed, namespace: str, tmp_path: Path) -> None:
    missing = mqtt(testbed, "sites", "nope", "-n", namespace)
    assert missing.returncode == 1
    assert f'MQTTCluster "nope" not found in namespace "{namespace}"' in missing.stderr
    default_ns = mqtt(testbed, "shards", "nope")  # the kubeconfig context's namespace
    assert 'not found in namespace "default"' in default_ns.stderr

    testbed.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    kubeconfig = service_account_kubeconfig(testbed, namespace, "nobody",
                                            tmp_path / "nobody.kubeconfig")
    denied = mqtt(testbed, "sites", "web", "-n", namespace, kubeconfig=kubeconfig)
    assert denied.returncode == 1
    assert "no access to MQTTCluster" in denied.stderr and "403" in denied.stderr
