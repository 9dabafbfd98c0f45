"""A real control plane (etcd, kube-apiserver, kube-controller-manager v1.20.2) per session.

The test bed's own scripts (tests/k8s/testbed/) build it once (cached in $K8S_TESTBED) and
start it in a private run directory on free loopback ports, so parallel sessions and a
developer's own test bed do not collide; down.sh stops it also when tests fail. The operator
runs in-process under kopf's KopfRunner, as the image would run it. What the API server's
pod proxy reaches goes through `PodNetwork`, since there is no pod network here.
"""

import base64
import contextlib
import http.server
import ipaddress
import json
import os
import socket
import socketserver
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TESTBED_SCRIPTS = ROOT / "tests" / "k8s" / "testbed"
CRD = ROOT / "crds" / "mqttcluster.yaml"
BUILT = Path(os.environ.get("K8S_TESTBED", "/var/cache/k8s-testbed"))
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"

# Third-party kinds the operator creates where they exist.
FOREIGN_CRDS = [ROOT / "tests" / "k8s" / "servicemonitor-crd.yaml",
                ROOT / "tests" / "k8s" / "sparkapplication-crd.yaml"]


def _free_port(pair_offset: int = 0) -> int:
    """A free loopback port (and port + pair_offset free too, for etcd's peer port)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if not pair_offset or port + pair_offset > 65535:
            return port
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", port + pair_offset))
            except OSError:
                continue
            return port


def _run(script: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(TESTBED_SCRIPTS / script)], env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)


@dataclass
class Testbed:
    __test__ = False  # not a test class, despite the name

    root: Path
    kubeconfig: Path
    env: dict[str, str]  # PATH with helm, kubectl and kubectl-mqtt; KUBECONFIG

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["kubectl", *args], env={**self.env, **(env or {})},
                                input=stdin, text=True, capture_output=True, timeout=60,
                                check=False)
        if check and result.returncode:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result

    def apply(self, document: dict[str, Any], namespace: str) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(document))

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        found = self.find(kind, name, namespace)
        assert found is not None, f"{kind} {namespace}/{name} does not exist"
        return found

    def find(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        result = self.kubectl("get", kind, name, "-n", namespace, "-o", "yaml", check=False)
        if result.returncode:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        return dict(yaml.safe_load(result.stdout))

    def items(self, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", kind, "-n", namespace, "-o", "yaml"]
        if selector:
            args += ["-l", selector]
        return list(yaml.safe_load(self.kubectl(*args).stdout)["items"])


POD_NET = ipaddress.ip_network("192.0.2.0/24")  # TEST-NET-1: never routed anywhere


def pod_ip(host: int) -> str:
    """Pod IP 192.0.2.N, which PodNetwork leads to 127.0.0.N: a test runs "pod N" as a
    process listening on that loopback address. (The API server refuses to proxy to
    loopback pod IPs, so pods reached through it cannot simply claim 127.0.0.1.)"""
    return str(POD_NET[host])


class PodNetwork(socketserver.ThreadingUnixStreamServer):
    """The pod network as the API server sees it: its egress for "cluster" traffic (the
    pods' proxy subresource) is this HTTP CONNECT proxy on a Unix socket, which connects
    pod IP 192.0.2.N to 127.0.0.N on the same port; anything else is 502."""

    daemon_threads = True

    def __init__(self, path: Path) -> None:
        super().__init__(str(path), _Tunnel)
        self.path = path

    def egress_config(self) -> str:
        connection = {"proxyProtocol": "HTTPConnect",
                      "transport": {"uds": {"udsName": str(self.path)}}}
        return json.dumps({
            "apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
            "egressSelections": [{"name": "cluster", "connection": connection}]})


class _Tunnel(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        request = self.rfile.readline().decode("latin-1").split()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # the API server's headers: nothing in them is needed
        try:
            host, port = request[1].rsplit(":", 1)
            address = ipaddress.ip_address(host)
            if request[0] != "CONNECT" or address not in POD_NET:
                raise ValueError(f"not a pod's address: {' '.join(request)}")
            pod = socket.create_connection((f"127.0.0.{address.packed[-1]}", int(port)),
                                           timeout=5)
        except (IndexError, ValueError, OSError) as error:
            self.wfile.write(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{error}".encode())
            return
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        with pod:
            pod.settimeout(None)
            back = threading.Thread(target=_pump, args=(pod.recv, self.connection),
                                    daemon=True)
            back.start()
            _pump(self.rfile.read1, pod)  # rfile: it may hold bytes read past the headers
            back.join()


def _pump(read: Callable[[int], bytes], sink: socket.socket) -> None:
    """Copies one direction until its end, then passes the end on (half-close)."""
    try:
        while chunk := read(65536):
            sink.sendall(chunk)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    base_env = {**os.environ, "K8S_TESTBED": str(BUILT)}
    for script, limit in (("build.sh", 1800), ("helm.sh", 300)):  # no-ops once built
        done = _run(script, base_env, limit)
        assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    root = tmp_path_factory.mktemp("k8s")
    (root / "bin").symlink_to(BUILT / "bin")
    crds = root / "crds.yaml"
    crds.write_text("\n---\n".join(path.read_text() for path in [CRD, *FOREIGN_CRDS]))
    pods = PodNetwork(root / "pods.sock")
    threading.Thread(target=pods.serve_forever, daemon=True).start()
    egress = root / "egress.json"
    egress.write_text(pods.egress_config())
    env = {
        **os.environ,
        "K8S_TESTBED": str(root),
        "K8S_PORT": str(_free_port()),
        "K8S_ETCD_PORT": str(_free_port(pair_offset=10)),
        "K8S_KCM_PORT": str(_free_port()),
        "CRDS": str(crds),  # before the controller-manager starts: its GC sees the kinds at once
        "K8S_EGRESS_CONFIG": str(egress),
        "PATH": f"{BUILT / 'bin'}:{VENV_BIN}:{os.environ['PATH']}",
    }
    try:
        up = _run("up.sh", env, 180)
        assert up.returncode == 0, (
            f"up.sh failed:\n{up.stderr}\n" + "\n".join(
                f"--- {log.name}\n{log.read_text()[-3000:]}"
                for log in sorted((root / "run").glob("*.log"))))
        kubeconfig = root / "run" / "kubeconfig"
        env["KUBECONFIG"] = str(kubeconfig)
        yield Testbed(root, kubeconfig, {k: v for k, v in env.items() if k != "CRDS"})
    finally:
        _run("down.sh", env, 120)
        pods.shutdown()
        pods.server_close()


@pytest.fixture(scope="session")
def operator_env(testbed: Testbed) -> Iterator[dict[str, str]]:
    """Environment for an in-process operator: session-wide, since kopf and the handlers
    read it at import and login."""
    settings = {"KUBECONFIG": str(testbed.kubeconfig), "MQTT_OPERATOR_RESYNC_SECONDS": "1",
                "MQTT_OPERATOR_BROKER_TIMEOUT": "1", "MQTT_OPERATOR_SPARK_POLL_SECONDS": "1",
                "MQTT_OPERATOR_METRICS_PORT": str(_free_port()),
                "MQTT_OPERATOR_METRICS_ADDR": "127.0.0.1"}
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    yield settings
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def namespace(testbed: Testbed) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    testbed.kubectl("create", "namespace", name)
    yield name
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@contextlib.contextmanager
def run_operator(namespace: str) -> Iterator[Any]:
    """kopf in this process, watching one namespace; stopped (and checked) on exit."""
    from kopf.testing import KopfRunner

    args = ["run", "--standalone", "--namespace", namespace, "-m", "mqtt_operator.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        yield runner
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None, runner.output


@pytest.fixture
def operator(operator_env: dict[str, str], namespace: str) -> Callable[[], Any]:
    return lambda: run_operator(namespace)


def eventually(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Polls `check` until it returns something truthy; the deadline, not a sleep, bounds it."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: {last!r}")


def cluster_manifest(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "mqtt.durablemqtt.io/v1alpha1", "kind": "MQTTCluster",
            "metadata": {"name": name}, "spec": spec}


def set_pod_ready(testbed: Testbed, namespace: str, pod: str, ip: str = "127.0.0.1",
                  ready: bool = True) -> None:
    """What a kubelet would report; there is none here, so the test says it (as kwok does)."""
    status = {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                         "conditions": [{"type": "Ready", "status": str(ready)}]}}
    testbed.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps(status))


def event_reasons(testbed: Testbed, namespace: str, name: str) -> list[str]:
    return [event["reason"] for event in testbed.items("events", namespace)
            if event["involvedObject"]["name"] == name
            and event["involvedObject"]["kind"] == "MQTTCluster"]


def service_account_kubeconfig(testbed: Testbed, namespace: str, account: str,
                               path: Path) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount (its token Secret, which the
    controller-manager of v1.20 creates), to check what exactly its RBAC allows."""
    secret = eventually(lambda: testbed.get("serviceaccount", account, namespace).get(
        "secrets"), what=f"token of {account}")[0]["name"]
    token = testbed.kubectl("get", "secret", secret, "-n", namespace, "-o",
                            "jsonpath={.data.token}").stdout
    server = testbed.kubectl("config", "view", "-o",
                             "jsonpath={.clusters[0].cluster.server}").stdout
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "sa", "cluster": {"server": server,
                                                "insecure-skip-tls-verify": True}}],
        "users": [{"name": "sa", "user": {"token": base64.b64decode(token).decode()}}],
        "contexts": [{"name": "sa", "context": {"cluster": "sa", "user": "sa",
                                                "namespace": namespace}}]}))
    return path


def api_key_of(testbed: Testbed, namespace: str, cluster: str) -> str:
    """KEY:SECRET of the viewer key in the cluster's API key Secret, as the operator reads it."""
    data = testbed.get("secret", f"{cluster}-api-key", namespace)["data"]
    return ":".join(base64.b64decode(data[key]).decode() for key in ("username", "password"))


class FakeBrokers:
    """The brokers' `GET /api/v5/ds/sites/{site}` and `GET /api/v5/ds/storages` (contract
    v3), answering what the test says each site holds and which generations are sealed;
    every pod in a test points its IP at it. It records the API key (HTTP Basic) of every
    call: the test compares them with the cluster's Secret."""

    def __init__(self) -> None:
        self.holding: dict[str, list[int]] = {}
        self.asked: set[str] = set()
        self.keys: set[str | None] = set()  # KEY:SECRET of each call, None: none sent
        self.sealed: dict[int, list[int]] = {}  # shard -> sealed generations
        brokers = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                basic = self.headers.get("Authorization", "").removeprefix("Basic ")
                brokers.keys.add(base64.b64decode(basic).decode() if basic else None)
                if self.path == "/api/v5/ds/storages":
                    body = json.dumps(brokers.storages()).encode()
                else:
                    site = self.path.rsplit("/", 1)[-1]
                    brokers.asked.add(site)
                    body = json.dumps({"up": True, "shards": [
                        {"storage": "messages", "id": str(shard), "status": "up"}
                        for shard in brokers.holding.get(site, [])]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def storages(self) -> dict[str, Any]:
        """The broker's shape (broker/ds: Storage.info): each shard's sealed generations
        and, after them, its current one."""
        return {"site_id": "FAKE", "databases": [{"name": "messages", "shards": [
            {"shard": shard, "generations": [
                *({"generation": g, "state": "sealed"} for g in generations),
                {"generation": max(generations, default=0) + 1, "state": "current"}]}
            for shard, generations in sorted(self.sealed.items())]}]}


@pytest.fixture
def brokers() -> Iterator[FakeBrokers]:
    fake = FakeBrokers()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
    thread.join()
