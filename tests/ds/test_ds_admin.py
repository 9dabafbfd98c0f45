"""Durable Storage through a real broker process: HTTP API, /metrics, `broker ctl ds`."""

import asyncio
import json
import urllib.request
from pathlib import Path

from broker.ds import DurableStorage, Settings
from broker.ds.storage import MESSAGES
from tests.ds.conftest import message
from tests.integration.clients import http_json, run_cli


def prefill(data_dir: Path, count: int) -> str:
    """Writes messages with the library while no broker runs; returns the site ID."""

    async def write() -> str:
        storage = DurableStorage(data_dir, Settings(n_shards=4))
        await storage.store_batch(MESSAGES, [message(f"m/{i}", f"p{i}") for i in range(count)])
        await storage.close()
        return storage.site_id

    return asyncio.run(write())


def test_http_info_seal_and_metrics(start_broker, tmp_path) -> None:
    data_dir = tmp_path / "data"
    site = prefill(data_dir, 40)
    broker = start_broker(data_dir, **{"durable_storage.messages.n_shards": "16"})
    http = broker.ports["http"]

    info = http_json(http, "/api/v5/ds/storages")
    assert info["site_id"] == site
    messages = next(db for db in info["databases"] if db["name"] == "messages")
    assert messages["n_shards"] == 4  # fixed at creation; the setting no longer applies
    generations = [g for s in messages["shards"] for g in s["generations"]]
    assert sum(g["messages"] for g in generations) == 40
    assert {g["state"] for g in generations} == {"current"}
    with_data = sum(1 for g in generations if g["messages"])

    request = urllib.request.Request(
        f"http://127.0.0.1:{http}/api/v5/ds/storages/messages/generations", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        sealed = json.loads(response.read())
    assert sealed["sealed"] == with_data
    states = [g["state"] for s in sealed["shards"] for g in s["generations"]]
    assert states.count("sealed") == with_data and states.count("current") == 4

    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert "ds_generations " + str(float(4 + with_data)) in text
    assert "ds_streams " in text and "ds_batches_total 0.0" in text

    assert broker.stop() == 0
    manifests = list(data_dir.glob("ds/messages/shard-*/gen-*/manifest.json"))
    assert len(manifests) == with_data


def test_ctl_ds_info_running_and_stopped(start_broker, tmp_path) -> None:
    data_dir = tmp_path / "data"
    site = prefill(data_dir, 10)
    broker = start_broker(data_dir)
    url = f"http://127.0.0.1:{broker.ports['http']}"

    text = run_cli("ctl", "ds", "info", "--url", url)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"SITE\n  {site} (this node)\n")
    assert "DB messages: 4 shards, replication factor 3" in text.stdout
    assert "SHARD GEN  STATE" in text.stdout and " current " in text.stdout
    as_json = run_cli("ctl", "ds", "info", "--url", url, "-o", "json")
    assert json.loads(as_json.stdout)["site_id"] == site

    locked = run_cli("ctl", "ds", "info", "--data-dir", str(data_dir))
    assert locked.returncode == 1 and "cannot read durable storage" in locked.stderr

    assert run_cli("ctl", "ds", "seal", "--url", url).stdout.startswith("sealed ")
    assert broker.stop() == 0
    offline = run_cli("ctl", "ds", "info", "--data-dir", str(data_dir), "-o", "json")
    assert offline.returncode == 0, offline.stderr
    info = json.loads(offline.stdout)
    assert info["site_id"] == site
    generations = [g for s in info["databases"][0]["shards"] for g in s["generations"]]
    assert sum(g["messages"] for g in generations if g["state"] == "sealed") == 10

    down = run_cli("ctl", "ds", "info", "--url", url)
    assert down.returncode == 1 and "cannot read durable storage" in down.stderr


def test_contradicting_site_id_stops_start_up(tmp_path) -> None:
    data_dir = tmp_path / "data"
    site = prefill(data_dir, 1)
    result = run_cli("run", "--set", f"node.data_dir={data_dir}",
                     "--set", "node.site_id=someone-else",
                     "--set", "listeners.tcp.default.bind=127.0.0.1:0",
                     "--set", "listeners.ws.default.bind=127.0.0.1:0",
                     "--set", "dashboard.listeners.http.bind=127.0.0.1:0")
    assert result.returncode == 2
    assert "node.site_id 'someone-else'" in result.stderr and site in result.stderr
    assert "Traceback" not in result.stderr
