"""API keys on the HTTP API of a real broker process: who gets in, who may change things,
what stays open for probes and scrapers, and `broker ctl` passing a key."""

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.clients import run_cli, wait_until
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

ADMIN = "ops:admin-secret-1"
VIEWER = "grafana:viewer-secret-2"
KEYS = "# bootstrap file\nops:admin-secret-1\ngrafana:viewer-secret-2:viewer\n"


def call(port: int, path: str, method: str = "GET", key: str | None = None,
         header: str = "Authorization", body: bytes | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request, with `key` as HTTP Basic or in `header`."""
    headers = {}
    if key is not None:
        headers[header] = ("Basic " + base64.b64encode(key.encode()).decode()
                           if header == "Authorization" else key)
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                     method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """keyed(**settings): a broker with the bootstrap file `KEYS` (tmp_path/keys)."""
    started: list[BrokerProcess] = []
    (tmp_path / "keys").write_text(KEYS)

    def start(**settings: str) -> BrokerProcess:
        process = BrokerProcess(tmp_path / f"data{len(started)}", {
            "api_key.bootstrap_file": str(tmp_path / "keys"), **settings})
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.kill()


def test_no_or_wrong_credentials_get_401_with_a_basic_challenge(
        keyed: Callable[..., BrokerProcess]) -> None:
    http = keyed().ports["http"]
    for key in (None, "ops:wrong-secret", "nobody:admin-secret-1", "ops", "ops:"):
        status, headers, body = call(http, "/api/v5/clients", key=key)
        assert status == 401, key
        assert headers["WWW-Authenticate"].startswith('Basic realm="broker"')
        assert json.loads(body)["code"] == "BAD_API_KEY_OR_SECRET"
    bearer = urllib.request.Request(f"http://127.0.0.1:{http}/api/v5/clients",
                                    headers={"Authorization": "Bearer admin-secret-1"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(bearer, timeout=10)
    assert refused.value.code == 401
    # Unknown paths too: no key, no telling which routes exist.
    assert call(http, "/api/v5/no-such-thing")[0] == 401
    assert call(http, "/api/v5/no-such-thing", key=ADMIN)[0] == 404


def test_keys_from_the_bootstrap_file_get_in_and_a_viewer_only_reads(
        keyed: Callable[..., BrokerProcess]) -> None:
    broker = keyed()
    http = broker.ports["http"]
    for key in (ADMIN, VIEWER):
        status, _, body = call(http, "/api/v5/clients", key=key)
        assert status == 200 and json.loads(body)["meta"]["count"] == 0
        assert call(http, "/api/v5/cluster", key=key)[0] == 200
        assert call(http, "/api/v5/clients", key=key, header="X-Api-Key")[0] == 200
    seal = "/api/v5/ds/storages/messages/generations"
    status, _, body = call(http, seal, "POST", key=VIEWER)
    assert status == 403 and json.loads(body)["code"] == "FORBIDDEN"
    assert call(http, "/api/v5/cluster/leave", "POST", key=VIEWER, body=b"{}")[0] == 403
    assert call(http, "/api/v5/cluster/x@y/force_leave", "DELETE", key=VIEWER)[0] == 403
    assert call(http, seal, "POST", key=ADMIN)[0] == 200
    assert call(http, "/api/v5/cluster/x@y/force_leave", "DELETE", key=ADMIN)[0] == 404
    assert broker.metric("mqtt_http_auth_failures_total", reason="forbidden") == 3


def test_probes_stay_open_and_metrics_are_open_by_default(
        keyed: Callable[..., BrokerProcess]) -> None:
    broker = keyed()
    http = broker.ports["http"]
    for path in ("/status", "/api/v5/status", "/api/v5/ready", "/metrics",
                 "/api/v5/prometheus/stats"):
        assert call(http, path)[0] == 200, path
    assert call(http, "/api/v5/ready", key="ops:wrong-secret")[0] == 200  # not even looked at
    assert broker.metric("mqtt_http_auth_failures_total", reason="missing") == 0
    assert call(http, "/status/")[0] == 401  # open means exactly these paths
    assert broker.metric("mqtt_http_auth_failures_total", reason="missing") == 1


def test_metrics_need_a_key_with_enable_basic_auth(keyed: Callable[..., BrokerProcess]) -> None:
    http = keyed(**{"prometheus.enable_basic_auth": "true"}).ports["http"]
    for path in ("/metrics", "/api/v5/prometheus/stats"):
        status, headers, _ = call(http, path)
        assert status == 401 and "WWW-Authenticate" in headers
        assert call(http, path, key=VIEWER)[0] == 200
    assert call(http, "/api/v5/ready")[0] == 200


def test_an_edited_file_takes_effect_and_a_broken_one_keeps_the_keys(
        keyed: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = keyed()
    http = broker.ports["http"]
    keys = tmp_path / "keys"
    new = tmp_path / "keys.new"  # replaced whole, as kubelet updates a mounted Secret
    new.write_text("rotated:fresh-secret-3\n")
    new.replace(keys)
    assert call(http, "/api/v5/clients", key=ADMIN)[0] == 401
    assert call(http, "/api/v5/clients", key="rotated:fresh-secret-3")[0] == 200
    new.write_text("rotated:fresh-secret-3:superuser\n")
    new.replace(keys)
    assert call(http, "/api/v5/clients", key="rotated:fresh-secret-3")[0] == 200
    wait_until(lambda: "reloading the API keys failed" in broker.log_text(), what="the log")
    assert f"{keys}:1: role 'superuser'" in broker.log_text()
    assert "fresh-secret-3" not in broker.log_text()


@pytest.mark.parametrize(("text", "why"), [
    ("ops\n", "keys:1: expected KEY:SECRET or KEY:SECRET:ROLE"),
    ("ok:secret-1\nops:s3cret:root\n", "keys:2: role 'root'"),
    ("ops:x\n", "keys:1: a secret is 3 to 128 characters"),
    ("ops:secret-1\nops:secret-2\n", "keys:2: key 'ops' is listed twice"),
    ("# nothing\n", "keys: no API keys"),
])
def test_a_bad_bootstrap_file_stops_start_up_naming_the_line(
        tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "keys").write_text(text)
    result = run_cli("run", "--set", f"node.data_dir={tmp_path / 'data'}",
                     "--set", f"api_key.bootstrap_file={tmp_path / 'keys'}",
                     "--set", "listeners.tcp.default.bind=127.0.0.1:0",
                     "--set", "listeners.ws.default.bind=off",
                     "--set", "dashboard.listeners.http.bind=127.0.0.1:0",
                     "--set", "rpc.listen_address=127.0.0.1", "--set", "rpc.tcp_server_port=0")
    assert result.returncode == 2, result.stderr
    assert "broker: cannot start:" in result.stderr and why in result.stderr
    assert "Traceback" not in result.stderr


def test_without_a_bootstrap_file_a_loopback_api_stays_open_and_says_so(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        assert call(broker.ports["http"], "/api/v5/clients")[0] == 200
        assert call(broker.ports["http"], "/api/v5/ds/storages/messages/generations",
                    "POST")[0] == 200
        assert "the HTTP API is open to every local process (127.0.0.1" in broker.log_text()
        assert not (tmp_path / "data" / "api_key").exists()
    finally:
        broker.kill()


def ctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", "ctl", *args], capture_output=True,
                          text=True, timeout=30, cwd=Path(__file__).parents[2],
                          env={**{k: v for k, v in os.environ.items() if k != "BROKER_API_KEY"},
                               **(env or {})})


def test_broker_ctl_passes_a_key_from_its_option_a_file_or_the_environment(
        keyed: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{keyed().ports['http']}"
    refused = ctl("cluster", "status", "--url", url)
    assert refused.returncode == 1
    assert "401: an API key is needed: --api-key KEY:SECRET" in refused.stderr
    wrong = ctl("sessions", "list", "--url", url, "--api-key", "ops:nope")
    assert wrong.returncode == 1 and "401: the API key was refused" in wrong.stderr
    for way in (["--api-key", ADMIN], ["--api-key-file", str(tmp_path / "keys")]):
        done = ctl("cluster", "status", "--url", url, *way, "-o", "json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["nodes"][0]["node_status"] == "running"
    by_env = ctl("ds", "info", "--url", url, "-o", "json", env={"BROKER_API_KEY": VIEWER})
    assert by_env.returncode == 0 and json.loads(by_env.stdout)["databases"]
    assert ctl("raft", "status", "--url", url, env={"BROKER_API_KEY": VIEWER}).returncode == 0
    # The option wins over the environment; a viewer may not seal.
    viewer_seal = ctl("ds", "seal", "--url", url, "--api-key", VIEWER,
                      env={"BROKER_API_KEY": ADMIN})
    assert viewer_seal.returncode == 1
    assert ("403: this key may only read; POST /api/v5/ds/storages/messages/generations needs"
            " an administrator key") in viewer_seal.stderr
    sealed = ctl("ds", "seal", "--url", url, env={"BROKER_API_KEY": ADMIN})
    assert sealed.returncode == 0 and sealed.stdout.startswith("sealed ")
