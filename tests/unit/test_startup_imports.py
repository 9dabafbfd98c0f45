"""What a node imports before its MQTT listeners serve (issue 42: the first CONNACK within
0.2 s of start with an empty data dir).

aiohttp (client and server), prometheus_client, PyJWT with cryptography, dnspython and the
`broker ctl` module cost more to import than everything else a start does. A node imports
them only where configured (JWT, HTTP authentication, DNS or k8s discovery) or once its MQTT
listeners serve (the HTTP API, broker/server/http_listener.py). wsproto and h11 come with
the WebSocket listener's first client (broker/server/websocket.py), the replicated storage's
Raft groups only with `durable_storage.messages.backend = builtin_raft`. A fresh interpreter, as
`broker run` starts, shows what the command-line module and a node started without the HTTP
API pulled in: no timing, only the modules' names.

It also counts the dataclasses those modules define: `dataclasses` compiles each one's
methods from source at import (about 1 ms of CPU each, even in compiled modules), and 94 of
them were a quarter of a start's CPU. Records that need no generated methods are
NamedTuples (0.2 ms) or plain classes (0.02 ms); the count may only go down.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DATACLASSES_AT_START = 9
"""Defined in the modules a start imports (`_SCRIPT` lists them); issue 42 took it from 94
(NamedTuples, plain classes and records: broker/mqtt/record.py). Those left are messages and
session records whose equality, `replace` or `astuple` code and tests rely on."""

DEFERRED = ("aiohttp", "prometheus_client", "jwt", "cryptography", "dns", "broker.ctl",
            "broker.http", "broker.metrics", "broker.server.http_app", "wsproto", "h11",
            "broker.server.websocket", "broker.cluster.ds_groups",
            # a str host's codec: listeners resolve literal addresses as bytes (reactor.py)
            "encodings.idna")

_SCRIPT = """
import asyncio, contextlib, io, json, sys
from broker import cli
with contextlib.redirect_stdout(io.StringIO()):
    cli.main(["config", "docs"])
from broker.config.loader import load_config
from broker.server.app import BrokerApp

async def start_and_stop():
    app = BrokerApp(load_config(None, [
        f"node.data_dir={sys.argv[1]}", "listeners.tcp.default.bind=127.0.0.1:0",
        "listeners.ws.default.bind=127.0.0.1:0", "dashboard.listeners.http.bind=off",
        "rpc.listen_address=127.0.0.1", "rpc.tcp_server_port=0"]))
    await app.start()
    try:
        return sorted(sys.modules)
    finally:
        await app.stop()

modules = asyncio.run(start_and_stop())
dataclasses = [f"{name}.{value.__qualname__}" for name in modules if name.startswith("broker")
               for value in vars(sys.modules[name]).values()
               if isinstance(value, type) and value.__module__ == name
               and "__dataclass_fields__" in vars(value)]
print(json.dumps({"modules": modules, "dataclasses": sorted(dataclasses)}))
"""


def _started(data_dir: Path) -> dict[str, list[str]]:
    """The modules a started node imported and the dataclasses they define."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(data_dir)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=data_dir, check=False)
    assert done.returncode == 0, done.stderr
    started: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    assert "broker.node" in started["modules"]  # the node was really made and started
    return started


def _deferred_imported(data_dir: Path) -> list[str]:
    return [name for name in _started(data_dir)["modules"]
            if any(name == d or name.startswith(d + ".") for d in DEFERRED)]


def test_a_started_node_without_the_http_api_imports_none_of_the_deferred_modules(
        tmp_path: Path) -> None:
    assert _deferred_imported(tmp_path) == []


def test_a_restart_imports_none_of_them_either(tmp_path: Path) -> None:
    """The second start finds the data dir made (formats, storage, cluster identity)."""
    assert _deferred_imported(tmp_path) == []
    assert _deferred_imported(tmp_path) == []


def test_a_start_builds_no_more_dataclasses_than_it_did(tmp_path: Path) -> None:
    built = _started(tmp_path)["dataclasses"]
    assert len(built) <= DATACLASSES_AT_START, built
