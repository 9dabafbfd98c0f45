"""Real broker processes forming clusters on loopback, each with its own data dir and ports.

Inter-node ports are chosen before the nodes start (a seed list names them), below the
kernel's ephemeral range (bench.brokers.free_port); every process is killed at teardown,
also on failure, and a frozen one is thawed first.
"""

import base64
import json
import os
import signal
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.brokers import free_port
from broker.cluster import versions
from tests.integration.clients import wait_until
from tests.support.broker_process import BrokerProcess

COOKIE = "test-cookie-3f9a"


def http_json(port: int, path: str, method: str = "GET", body: Any = None,
              api_key: str | None = None) -> Any:
    """The answer of a node's HTTP API; `api_key` (KEY:SECRET) for nodes given a bootstrap
    file (without one, on loopback, the API is open)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if api_key is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(api_key.encode()).decode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@dataclass
class Node:
    name: str
    rpc_port: int
    process: BrokerProcess
    settings: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None  # what its HTTP API asks for, if anything

    @property
    def seed(self) -> str:
        return f"{self.name}@127.0.0.1:{self.rpc_port}"

    @property
    def node_name(self) -> str:
        return f"{self.name}@127.0.0.1"

    @property
    def http(self) -> int:
        return self.process.ports["http"]

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    def statuses(self) -> dict[str, str]:
        """node name -> node_status, as this node's membership sees it."""
        nodes = http_json(self.http, "/api/v5/cluster", api_key=self.api_key)["nodes"]
        return {entry["node"]: entry["node_status"] for entry in nodes}

    def metric(self, name: str, **labels: str) -> float:
        return self.process.metric(name, **labels)

    def cluster_version(self) -> int:
        """The cluster's effective version as this node applied it (this tree's API)."""
        return int(http_json(self.http, "/api/v5/cluster", api_key=self.api_key)
                   ["cluster_version"])

    def start(self) -> "Node":
        self.process.start()
        return self


class Cluster:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.nodes: list[Node] = []

    def make(self, count: int, **settings: str) -> list[Node]:
        """`count` nodes seeded with each other (not started)."""
        new = [Node(f"n{len(self.nodes) + i + 1}", free_port(), None)  # type: ignore[arg-type]
               for i in range(count)]
        seeds = ",".join(node.seed for node in [*self.nodes, *new])
        for node in new:
            node.settings = {
                "node.name": node.node_name, "node.cookie": COOKIE,
                "rpc.tcp_server_port": str(node.rpc_port),
                "cluster.discovery_strategy": "static", "cluster.static.seeds": seeds,
                "node.dist_net_ticktime": "2s", **settings,
            }
            node.process = BrokerProcess(self.tmp_path / node.name, node.settings)
        self.nodes += new
        return new

    def start(self, count: int, **settings: str) -> list[Node]:
        nodes = self.make(count, **settings)
        for node in nodes:
            node.start()
        return nodes

    def wait_statuses(self, observers: list[Node], expected: dict[str, str],
                      timeout: float = 20.0) -> None:
        """Every observer sees exactly `expected` (node name -> status) for those nodes."""
        def agreed() -> bool:
            for observer in observers:
                seen = observer.statuses()
                if any(seen.get(name) != status for name, status in expected.items()):
                    return False
            return True

        wait_until(agreed, timeout, f"cluster statuses {expected}")

    def all_running(self, nodes: list[Node], timeout: float = 20.0) -> None:
        self.wait_statuses(nodes, {node.node_name: "running" for node in nodes}, timeout)

    @staticmethod
    def wait_version(nodes: list[Node], version: int = versions.HIGHEST,
                     timeout: float = 20.0) -> None:
        """Every node has applied the cluster's rise to `version` (this tree's highest by
        default: what a fresh cluster of it reaches once its members are linked)."""
        wait_until(lambda: all(node.cluster_version() == version for node in nodes), timeout,
                   f"cluster version {version} on {[node.name for node in nodes]}")

    def stop_all(self) -> None:
        for node in self.nodes:
            proc = node.process.proc
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
            node.process.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    yield made
    made.stop_all()


StartCluster = Callable[..., list[Node]]
