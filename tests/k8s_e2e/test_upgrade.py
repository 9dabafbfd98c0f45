"""A rolling upgrade on pods (`make test-k8s-e2e`), as the README tells users to do it:
`helm upgrade --set image.tag=...` on a 3-pod release while the fault harness's checked
workload runs through the client Service (QoS 1 publishers, durable subscribers that
reconnect through the Service IP to whichever pod kube-proxy picks). The operator's
Deployment takes the new image too; the StatefulSet then rolls the brokers one pod at a
time, each Ready (joined) before the next stops, and every acknowledged message arrives and
every durable reconnect finds its session (Session Present 1).

First from the previous release's image (RELEASES, built from its own commit) to this
tree's, then from this tree's image to a second tag of it: that roll stops pods that run
this tree, which hand their Raft leaderships over on SIGTERM (the graceful stop) before
they tell their clients 0x8B.
"""

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from broker.cluster import versions
from broker.version import RELEASE
from tests.cluster.jepsen.workload import (
    Directory,
    Recorder,
    Workload,
    WorkloadConfig,
    run_together,
)
from tests.k8s.conftest import Testbed, eventually
from tests.k8s_e2e.cluster import (
    api_key,
    ask,
    brokers,
    describe,
    helm,
    install,
    ready,
    service_ip,
    wait_brokers,
)
from tests.k8s_e2e.conftest import CHART
from tests.k8s_e2e.test_e2e import CLUSTER, settled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPOSITORY = "durable-mqtt-broker"
RETAG = f"{RELEASE}-rolled"  # the same image under a second tag: a roll of this tree


def _operator_images(node: Testbed, namespace: str) -> list[str]:
    """The images of the operator's running, Ready pods."""
    pods = node.items("pods", namespace, "app.kubernetes.io/component=operator")
    return [p["spec"]["containers"][0]["image"] for p in pods
            if ready(p) and not p["metadata"].get("deletionTimestamp")]


def _upgrade(node: Testbed, namespace: str, name: str, tag: str) -> None:
    helm(node, "upgrade", name, str(CHART), "-n", namespace, "--reuse-values",
         "--set", f"image.tag={tag}")


def _roll(node: Testbed, namespace: str, name: str, tag: str, timeout: float = 900) -> int:
    """Waits until every broker pod runs `tag` and is Ready and the StatefulSet has no
    older revision left, checking on the way that at most one broker is ever out of the
    Service (not Ready, or stopping). Returns how many broker pods were replaced."""
    image = f"{REPOSITORY}:{tag}"
    seen: set[str] = {p["metadata"]["uid"] for p in brokers(node, namespace, name)}
    before = set(seen)
    deadline = time.monotonic() + timeout
    while True:
        pods = brokers(node, namespace, name)
        seen.update(p["metadata"]["uid"] for p in pods)
        out = [p["metadata"]["name"] for p in pods
               if not ready(p) or p["metadata"].get("deletionTimestamp")]
        out += ["(missing)"] * max(0, 3 - len(pods))
        assert len(out) <= 1, f"two brokers out of the Service at once: {out}\n" \
                              f"{describe(node, namespace)}"
        status = node.get("statefulset", name, namespace).get("status", {})
        if (len(pods) == 3 and not out
                and all(p["spec"]["containers"][0]["image"] == image for p in pods)
                and status.get("updateRevision") == status.get("currentRevision")
                and status.get("updatedReplicas") == 3):
            return len(seen - before)
        if time.monotonic() > deadline:
            raise AssertionError(f"the roll to {image} did not end in {timeout}s\n"
                                 f"{describe(node, namespace)}")
        time.sleep(0.5)


def _follow_logs(node: Testbed, namespace: str, pods: list[dict[str, Any]],
                 into: Path) -> list[tuple[subprocess.Popen[str], Path]]:
    """`kubectl logs -f` of each pod into a file, to read what a pod said while it stopped
    (a StatefulSet's replaced pod is deleted, and its log with it)."""
    followed = []
    for pod in pods:
        path = into / f"{pod['metadata']['name']}-{pod['metadata']['uid'][:8]}.log"
        with path.open("w") as out:
            follower = subprocess.Popen(
                ["kubectl", "logs", "-f", "-n", namespace, pod["metadata"]["name"]],
                env=node.env, stdout=out, stderr=subprocess.STDOUT, text=True)
        followed.append((follower, path))
    return followed


def _cluster_versions(pods: list[dict[str, Any]], key: str) -> list[int]:
    return [int(ask(pod, "/api/v5/cluster", key)["cluster_version"]) for pod in pods]


def test_helm_upgrade_rolls_the_brokers_pod_by_pod_under_load_and_loses_nothing(
        node: Testbed, release: tuple[str, str], previous_image: str,
        tmp_path: Path) -> None:
    namespace, name = release
    install(node, namespace, name, *CLUSTER, f"image.tag={previous_image}")
    pods = wait_brokers(node, namespace, name, 3)
    eventually(lambda: settled(node, namespace, name, 3), timeout=180,
               what="replica transitions settled")
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {
        f"{REPOSITORY}:{previous_image}"}
    assert _operator_images(node, namespace) == [f"{REPOSITORY}:{previous_image}"]

    host = service_ip(node, namespace, name)
    # MQTT 5 clients (told 0x8B by a stopping pod) and MQTT 3.1.1 ones (whose connection
    # it closes), all QoS 1 through the Service.
    configs = [WorkloadConfig(seed=38, publishers=3, subscribers=3, rate=10.0, qos2_share=0.0,
                              stay=(1.0, 5.0), keepalive=5, connect_timeout=10.0, host=host),
               WorkloadConfig(seed=39, publishers=1, subscribers=2, rate=10.0, qos2_share=0.0,
                              stay=(1.0, 5.0), keepalive=5, connect_timeout=10.0, host=host,
                              version=4)]
    directory = Directory({"service": 1883})
    workloads = [Workload(directory, Recorder(), config) for config in configs]
    with contextlib.ExitStack() as stack:
        for workload in workloads:
            stack.enter_context(workload).start(timeout=120)
        run_together(workloads, 5)

        # The previous release's pods to this tree's, operator included.
        started = time.monotonic()
        _upgrade(node, namespace, name, RELEASE)
        replaced = _roll(node, namespace, name, RELEASE)
        first_roll = time.monotonic() - started
        assert replaced >= 3
        eventually(lambda: _operator_images(node, namespace) == [f"{REPOSITORY}:{RELEASE}"],
                   timeout=120, what="the operator on the new image")
        pods = wait_brokers(node, namespace, name, 3)
        key = api_key(node, namespace, name)
        # Every member runs this tree: the effective cluster version rises.
        eventually(lambda: _cluster_versions(pods, key) == [versions.HIGHEST] * 3,
                   timeout=120, what="the cluster version raised on every pod")
        run_together(workloads, 5)

        # A roll of this tree: the stopping pods hand their leaderships over first.
        _retag(node, f"{REPOSITORY}:{RELEASE}", f"{REPOSITORY}:{RETAG}")
        followed = _follow_logs(node, namespace, pods, tmp_path)
        started = time.monotonic()
        _upgrade(node, namespace, name, RETAG)
        assert _roll(node, namespace, name, RETAG) == 3
        second_roll = time.monotonic() - started
        run_together(workloads, 5)
        reports = [workload.finish(drain_timeout=60) for workload in workloads]
    for follower, _ in followed:
        follower.wait(timeout=30) if follower.poll() is None else None
    handed = {path.name: [line for line in path.read_text().splitlines()
                          if "handed the leadership of" in line] for _, path in followed}
    print(f"rolls: {first_roll:.0f} s from {previous_image} ({replaced} pods replaced),"
          f" {second_roll:.0f} s to {RETAG}; hand-overs: {handed}")
    for workload, report in zip(workloads, reports, strict=True):
        print(f"MQTT {'5' if workload.config.version == 5 else '3.1.1'}:", report.summary(),
              workload.stats)
        if not report.ok:
            workload.recorder.dump(tmp_path / f"history-{workload.config.version}.jsonl")
        assert report.ok, report.summary()
        assert report.acknowledged > 0 and report.sessions_lost == 0
        # Subscribers reconnected through the Service while pods were replaced.
        assert workload.stats.subscriber_connections > 3 * workload.config.subscribers
    assert any(handed.values()), "no stopping pod handed its Raft leaderships over:\n" + \
        "\n".join(f"--- {path.name}\n{path.read_text()[-2000:]}" for _, path in followed)


def _retag(node: Testbed, image: str, tag: str) -> None:
    """A second tag of an image the node's containerd holds (what a registry would serve)."""
    ctr = ["ctr", "--address", str(node.root / "run" / "node" / "containerd.sock"), "-n",
           "k8s.io", "images", "tag", "--force", f"docker.io/library/{image}",
           f"docker.io/library/{tag}"]
    done = subprocess.run(ctr, text=True, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, f"ctr images tag: {done.stderr}"
