"""Prometheus for real: Debian's `prometheus` scrapes a live broker and answers for its
series through its HTTP API, and `promtool check metrics` accepts what `/metrics` serves.

Prometheus binds loopback only and is stopped by its PID at teardown, also when the test
failed. Its start is awaited on its own log line; what it has scraped can only be asked
for, so those waits poll its query API.
"""

import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import Cluster, Node, free_port
from tests.integration.clients import PahoClient, unique, wait_until
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

READY_LINE = "Server is ready to receive web requests"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"Debian's {name} is missing: make install brings the prometheus package"
    return path


@dataclass
class Prometheus:
    port: int
    proc: subprocess.Popen[str]
    log: list[str]

    def query(self, expression: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": expression}))
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def names(self) -> set[str]:
        url = f"http://127.0.0.1:{self.port}/api/v1/label/__name__/values"
        with urllib.request.urlopen(url, timeout=10) as response:
            return set(json.load(response)["data"])


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    """prometheus(*http_ports): Prometheus scraping those brokers every second."""
    started: list[subprocess.Popen[str]] = []

    def start(*targets: int) -> Prometheus:
        config = tmp_path / "prometheus.yml"
        listed = ", ".join(f"'127.0.0.1:{port}'" for port in targets)
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: broker\n    static_configs: [{{targets: [{listed}]}}]\n")
        port = free_port()
        proc = subprocess.Popen(
            [_tool("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        log: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                log.append(line.rstrip())
                if READY_LINE in line:
                    ready.set()
            ready.set()  # exited: the wait below ends and the check says so

        threading.Thread(target=read, daemon=True).start()
        assert ready.wait(30) and proc.poll() is None, "prometheus did not start:\n" + "\n".join(
            log[-20:])
        return Prometheus(port, proc, log)

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _scrape(broker: BrokerProcess) -> str:
    url = f"http://127.0.0.1:{broker.ports['http']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_prometheus_scrapes_a_live_broker_and_answers_for_its_series(
        broker: BrokerProcess, prometheus: Callable[..., Prometheus],
        clients: list[PahoClient]) -> None:
    publisher = PahoClient(broker.tcp, unique("prom"))
    clients.append(publisher)
    publisher.connect()
    for _ in range(5):
        publisher.publish(unique("prom/t").replace("-", "/"), b"x", qos=1)
    server = prometheus(broker.ports["http"])
    up = wait_until(lambda: server.query('up{job="broker"} == 1'), timeout=20,
                    what="the broker's target to be up")
    assert up[0]["metric"]["instance"] == f"127.0.0.1:{broker.ports['http']}"
    received = wait_until(lambda: server.query('mqtt_messages_received_total{qos="1"} >= 5'),
                          timeout=20, what="the publishes to be scraped")
    assert float(received[0]["value"][1]) >= 5
    connections = server.query('mqtt_connections{job="broker"}')
    assert [float(sample["value"][1]) for sample in connections] == [1.0]
    # Every series the broker exposes comes through (a later scrape has them all).
    exposed = {line.split("{")[0].split(" ")[0] for line in _scrape(broker).splitlines()
               if line and not line.startswith("#")}
    wait_until(lambda: exposed <= server.names(), timeout=20,
               what="Prometheus to store every series /metrics exposes")


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[list[Node]]:
    """A running three-node cluster (tests/cluster's helpers), killed at teardown."""
    cluster = Cluster(tmp_path / "cluster")
    try:
        nodes = cluster.start(3)
        cluster.all_running(nodes)
        yield nodes
    finally:
        cluster.stop_all()


def test_prometheus_scrapes_every_node_of_a_three_node_cluster(
        three_nodes: list[Node], prometheus: Callable[..., Prometheus],
        clients: list[PahoClient]) -> None:
    nodes = three_nodes
    for node in nodes:
        publisher = PahoClient(node.process.tcp, unique(node.name))
        clients.append(publisher)
        publisher.connect()
        publisher.publish(unique("prom/c").replace("-", "/"), b"x", qos=1)
    server = prometheus(*(node.http for node in nodes))
    wait_until(lambda: server.query('count(up{job="broker"} == 1) == 3'), timeout=20,
               what="all three nodes to be up")
    instances = {f"127.0.0.1:{node.http}" for node in nodes}

    def every_node(expression: str) -> set[str]:
        """The instances whose series `expression` returns, once all three do."""
        return wait_until(lambda: len(found := {sample["metric"]["instance"] for sample in
                                                server.query(expression)}) == 3 and found,
                          timeout=20, what=f"{expression} on every node")

    assert every_node('mqtt_cluster_joined{job="broker"} == 1') == instances
    assert every_node("mqtt_cluster_members == 3") == instances
    received = wait_until(
        lambda: server.query('sum(mqtt_messages_received_total{qos="1"}) >= 3'), timeout=20,
        what="each node's publish to be scraped")
    assert float(received[0]["value"][1]) == 3


def test_promtool_accepts_the_metrics_of_a_busy_broker(
        start_broker: Callable[..., BrokerProcess], tmp_path: Path,
        clients: list[PahoClient]) -> None:
    """Families that appear only once something happened (drops, refusals, Raft groups,
    auth failures) are there when promtool reads them."""
    keys = tmp_path / "keys"
    keys.write_text("ops:secret-1\n")
    broker = start_broker(**{"durable_storage.messages.backend": "builtin_raft",
                             "api_key.bootstrap_file": str(keys)})
    client = PahoClient(broker.tcp, unique("busy"))
    clients.append(client)
    client.connect(session_expiry=60)
    client.subscribe("busy/#", 1)
    client.publish("busy/1", b"x", qos=1, retain=True)
    client.publish("$SYS/not-yours", b"x", qos=1)  # dropped: sys_topic_denied
    with pytest.raises(urllib.error.HTTPError):  # an auth failure, counted
        urllib.request.urlopen(f"http://127.0.0.1:{broker.ports['http']}/api/v5/clients",
                               timeout=10)
    login = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}/api/v5/login", method="POST",
        data=b'{"username": "admin", "password": "public"}')
    urllib.request.urlopen(login, timeout=10).close()
    text = _scrape(broker)
    for family in ("mqtt_messages_dropped_total{", "mqtt_http_auth_failures_total",
                   "mqtt_dashboard_logins_total", "raft_wal_fsync_seconds_bucket"):
        assert family in text, family
    checked = subprocess.run([_tool("promtool"), "check", "metrics"], input=text,
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (checked.stdout + checked.stderr).strip() == ""


def test_promtool_would_catch_a_bad_family() -> None:
    """The check above can fail: a counter without `_total` is flagged."""
    checked = subprocess.run([_tool("promtool"), "check", "metrics"],
                             input="# HELP bad_things Things\n# TYPE bad_things counter\n"
                                   "bad_things 1\n",
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode != 0 and "_total" in checked.stdout + checked.stderr
