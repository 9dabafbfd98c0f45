"""Prometheus (Debian's) scraping what a ServiceMonitor selects. There is no Prometheus
Operator here, and Debian builds Prometheus without Kubernetes service discovery, so the
test does the operator's selection itself: the Services in the monitor's namespaces with
its labels, their Endpoints' addresses on the endpoint's named port, as static targets."""

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.container.engine import wait_http
from tests.k8s.conftest import Testbed, _free_port


def selected_targets(node: Testbed, monitor: dict[str, Any]) -> list[str]:
    spec = monitor["spec"]
    [endpoint] = spec["endpoints"]
    selector = ",".join(f"{k}={v}" for k, v in spec["selector"]["matchLabels"].items())
    found = []
    for namespace in spec["namespaceSelector"]["matchNames"]:
        for service in node.items("services", namespace, selector):
            endpoints = node.get("endpoints", service["metadata"]["name"], namespace)
            for subset in endpoints.get("subsets") or []:
                port = next(p["port"] for p in subset["ports"] if p.get("name") == endpoint["port"])
                found += [f"{address['ip']}:{port}" for address in subset.get("addresses") or []]
    return sorted(found)


@contextmanager
def prometheus(monitor: dict[str, Any], targets: list[str], workdir: Path) -> Iterator[int]:
    """Prometheus on a free loopback port scraping the targets every second with the
    monitor's path; yields its port."""
    config = {"scrape_configs": [{"job_name": monitor["metadata"]["name"], "scrape_interval": "1s",
                                  "metrics_path": monitor["spec"]["endpoints"][0]["path"],
                                  "static_configs": [{"targets": targets}]}]}
    with run_prometheus(config, workdir) as port:
        yield port


@contextmanager
def run_prometheus(config: dict[str, Any], workdir: Path) -> Iterator[int]:
    """Debian's Prometheus with `config` on a free loopback port, stopped on leaving;
    yields its port once it is ready."""
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus is missing: make install brings it"
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    with (workdir / "prometheus.log").open("w") as log, subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=log) as proc:
        try:
            try:
                wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60)
            except OSError as error:
                said = (workdir / "prometheus.log").read_text()[-2000:]
                raise AssertionError(f"prometheus not ready: {error}\n{said}") from error
            yield port
        finally:
            proc.terminate()
            proc.wait(30)


def query(port: int, expression: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(
        {"query": expression})
    with urllib.request.urlopen(url, timeout=10) as response:
        return list(json.load(response)["data"]["result"])
