"""A test bed whose pods run: the control plane of tests/k8s plus a node (kubelet,
kube-proxy, kube-scheduler, containerd; tests/k8s/testbed/kubelet/) with the images built
by tools/image imported, so `helm install` starts real operator and broker pods.

One node test bed per machine at a time (kube-proxy owns the host's KUBE-* iptables
chains): a lock file serialises sessions. Tests marked `slow` run only with K8S_E2E=1
(`make test-k8s-e2e`); `make test` runs the others.
"""

import fcntl
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.version import RELEASE
from tests.container.engine import Engine, build_images, detect
from tests.k8s.conftest import (
    BUILT,
    CRD,
    FOREIGN_CRDS,
    ROOT,
    TESTBED_SCRIPTS,
    VENV_BIN,
    Testbed,
    _free_port,
    _run,
)
from tests.support.releases import releases

NODE_SCRIPTS = TESTBED_SCRIPTS / "kubelet"
CHART = ROOT / "helm" / "durable-mqtt"
IMAGE = f"durable-mqtt-broker:{RELEASE}"  # the chart's default: image.repository:appVersion
PREVIOUS = list(releases())[-1]  # the release a rolling upgrade starts from
LOCK = Path("/run/lock/k8s-testbed-node.lock")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: end to end on the test bed's node "
                                       "(make test-k8s-e2e)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("K8S_E2E") == "1":
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def _script(path: Path, env: dict[str, str], timeout: float) -> None:
    done = subprocess.run(["bash", str(path)], env=env, text=True, capture_output=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{path.name} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    base = {**os.environ, "K8S_TESTBED": str(BUILT)}
    for script, limit in ((TESTBED_SCRIPTS / "build.sh", 1800), (TESTBED_SCRIPTS / "helm.sh", 300),
                          (NODE_SCRIPTS / "build.sh", 1800)):  # no-ops once built
        _script(script, base, limit)
    build_images(dict(os.environ))
    engine = detect(dict(os.environ))
    root = tmp_path_factory.mktemp("node")
    (root / "bin").symlink_to(BUILT / "bin")
    (root / "images").mkdir()
    (root / "images" / "pause.tar").symlink_to(BUILT / "images" / "pause.tar")
    archive = root / "broker.tar"
    _save(engine, IMAGE, archive)
    crds = root / "crds.yaml"
    crds.write_text("\n---\n".join(path.read_text() for path in [CRD, *FOREIGN_CRDS]))
    proxy_port = _free_port(pair_offset=1)
    env = {**os.environ, "K8S_TESTBED": str(root), "K8S_PORT": str(_free_port()),
           "K8S_ETCD_PORT": str(_free_port(pair_offset=10)), "K8S_KCM_PORT": str(_free_port()),
           "K8S_KUBELET_PORT": str(_free_port()), "K8S_PROXY_PORT": str(proxy_port),
           "K8S_IMAGES": str(archive), "CRDS": str(crds),
           "KUBECONFIG": str(root / "run" / "kubeconfig"),
           "PATH": f"{BUILT / 'bin'}:{VENV_BIN}:{os.environ['PATH']}"}
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            up = _run("up.sh", env, 180)
            assert up.returncode == 0, f"up.sh failed:\n{up.stderr}"
            _script(NODE_SCRIPTS / "up.sh", env, 300)
            yield Testbed(root, root / "run" / "kubeconfig",
                          {k: v for k, v in env.items() if k != "CRDS"})
        finally:
            subprocess.run(["bash", str(NODE_SCRIPTS / "down.sh")], env=env, timeout=300,
                           check=False, capture_output=True)
            _run("down.sh", env, 120)


def _save(engine: Engine, image: str, archive: Path) -> None:
    engine("save", *(["--format", "docker-archive"] if engine.command == "podman" else []),
           "-o", str(archive), image, timeout=300)


@pytest.fixture(scope="session")
def previous_image(node: Testbed) -> str:
    """The previous release's image (tools/image/build_release.sh: from its own commit, once),
    imported into the node's containerd as up.sh imports this tree's: the tag a rolling
    upgrade (`helm upgrade --set image.tag=...`) starts from."""
    done = subprocess.run(["bash", "tools/image/build_release.sh", PREVIOUS], cwd=ROOT,
                          text=True, capture_output=True, timeout=3000, check=False)
    assert done.returncode == 0, f"building {PREVIOUS} failed:\n{done.stdout}\n{done.stderr}"
    import_image(node, f"durable-mqtt-broker:{PREVIOUS}")
    return PREVIOUS


@pytest.fixture(scope="session")
def spark_image(node: Testbed) -> str:
    """This tree's Spark image (tools/image/build.sh built it with the broker's) in the
    node's containerd, for the SparkApplications' pods: imported only by the tests that run
    them (1.4 GB)."""
    image = f"durable-mqtt-spark:{RELEASE}"
    import_image(node, image)
    return image


def import_image(node: Testbed, image: str) -> None:
    """An image of the engine's into the node's containerd, under the name Kubernetes gives
    an image without a registry (podman's are localhost/...)."""
    engine = detect(dict(os.environ))
    archive = node.root / f"{image.replace(':', '-')}.tar"
    _save(engine, image, archive)
    ctr = ["ctr", "--address", str(node.root / "run" / "node" / "containerd.sock"), "-n",
           "k8s.io", "images"]
    commands = [["import", str(archive)]]
    if engine.command == "podman":  # podman names it localhost/..., Kubernetes docker.io/...
        commands.append(["tag", "--force", f"localhost/{image}", f"docker.io/library/{image}"])
    for command in commands:
        imported = subprocess.run([*ctr, *command], text=True, capture_output=True,
                                  timeout=600, check=False)
        assert imported.returncode == 0, f"ctr images {command[0]}: {imported.stderr}"
    archive.unlink()


def keep_logs(node: Testbed, namespace: str) -> Path:
    """Every container's whole log (and its previous run's) in the namespace, for what a
    failure message cuts short: under $K8S_E2E_LOGS, else in the node's directory (which
    pytest removes after a few more sessions)."""
    kept = Path(os.environ.get("K8S_E2E_LOGS", node.root / "logs")) / namespace
    kept.mkdir(parents=True, exist_ok=True)
    pods = node.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).stdout
    for pod in pods.split():
        for previous in ("false", "true"):
            log = node.kubectl("logs", "-n", namespace, pod, "--all-containers",
                               "--timestamps", f"--previous={previous}", check=False)
            suffix = ".previous" if previous == "true" else ""
            (kept / f"{pod.split('/')[-1]}{suffix}.log").write_text(log.stdout + log.stderr)
    return kept


@pytest.fixture
def release(node: Testbed) -> Iterator[tuple[str, str]]:
    """A namespace for one `helm install` (release `mq`), uninstalled afterwards."""
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    node.kubectl("create", "namespace", namespace)
    yield namespace, "mq"
    keep_logs(node, namespace)
    subprocess.run(["helm", "uninstall", "mq", "-n", namespace, "--wait", "--timeout", "60s"],
                   env=node.env, capture_output=True, timeout=120, check=False)
    node.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
