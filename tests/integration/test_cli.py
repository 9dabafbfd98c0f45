"""The `broker` command itself: configuration errors, `--config` files, signals, exit codes."""

import socket

import pytest

from broker.config.schema import SETTINGS
from tests.integration.clients import CliBroker, PahoClient, http_json, run_cli, unique

pytestmark = pytest.mark.integration

LOOPBACK = {
    "listeners.tcp.default.bind": "127.0.0.1:0",
    "listeners.ws.default.bind": "127.0.0.1:0",
    "dashboard.listeners.http.bind": "127.0.0.1:0",
}


def _sets(settings: dict[str, str]) -> list[str]:
    args: list[str] = []
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    return args


def _assert_config_error(result, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_unknown_key_is_refused(tmp_path) -> None:
    result = run_cli("run", *_sets({**LOOPBACK, "node.data_dir": str(tmp_path),
                                    "mqtt.no_such_key": "1"}))
    _assert_config_error(result, "unknown configuration key", "'mqtt.no_such_key'")


@pytest.mark.parametrize(("key", "value"), [
    ("mqtt.max_inflight", "lots"),
    ("mqtt.max_inflight", "0"),
    ("mqtt.session_expiry_interval", "forever"),
    ("mqtt.max_packet_size", "1TB"),
    ("mqtt.retain_available", "maybe"),
    ("mqtt.keepalive_multiplier", "0.5"),
    ("listeners.tcp.default.bind", "127.0.0.1:99999"),
    ("log.console.level", "loud"),
])
def test_bad_value_is_refused_naming_the_key(tmp_path, key, value) -> None:
    result = run_cli("run", *_sets({**LOOPBACK, "node.data_dir": str(tmp_path), key: value}))
    _assert_config_error(result, "invalid value", f"'{key}'")


def test_set_without_equals_sign(tmp_path) -> None:
    result = run_cli("run", "--set", "mqtt.max_inflight")
    _assert_config_error(result, "expected KEY=VALUE")


def test_config_file_errors(tmp_path) -> None:
    bad_key = tmp_path / "bad_key.toml"
    bad_key.write_text("[mqtt]\nmax_inflight = 5\nbogus = 1\n")
    _assert_config_error(run_cli("run", "--config", str(bad_key)), str(bad_key), "'mqtt.bogus'")

    bad_value = tmp_path / "bad_value.toml"
    bad_value.write_text('[retainer]\nmax_retained_messages = "many"\n')
    _assert_config_error(run_cli("run", "-c", str(bad_value)), str(bad_value),
                         "'retainer.max_retained_messages'")

    not_toml = tmp_path / "not.toml"
    not_toml.write_text("this is = = not toml\n")
    _assert_config_error(run_cli("run", "--config", str(not_toml)), "not valid TOML")

    _assert_config_error(run_cli("run", "--config", str(tmp_path / "missing.toml")),
                         "cannot read config file")


def test_config_file_applies_and_set_overrides(tmp_path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(f"""
[node]
name = "toml-node@test"
data_dir = "{tmp_path / 'data'}"

[listeners.tcp.default]
bind = "127.0.0.1:0"

[listeners.ws.default]
bind = "127.0.0.1:0"

[dashboard.listeners.http]
bind = "127.0.0.1:0"

[rpc]
listen_address = "127.0.0.1"
tcp_server_port = 0

[mqtt]
max_inflight = 7
max_topic_alias = 9
retain_available = false
session_expiry_interval = "90s"
""")
    broker = CliBroker("run", "--config", str(config), "--set", "mqtt.max_topic_alias=5")
    try:
        broker.start()
        assert "broker toml-node@test started" in "\n".join(broker.lines)
        assert http_json(broker.ports["http"], "/api/v5/status")["node"] == "toml-node@test"
        client = PahoClient(broker.ports["tcp"], unique("cfg"))
        try:
            connack = client.connect()
            assert connack.prop("ReceiveMaximum") == 7  # from the file
            assert connack.prop("TopicAliasMaximum") == 5  # --set wins over the file
            assert connack.prop("RetainAvailable") == 0
        finally:
            client.close()
        v3 = PahoClient(broker.ports["tcp"], unique("cfg3"), version=4, clean_session=False)
        try:
            v3.connect()
            view = http_json(broker.ports["http"], f"/api/v5/clients/{v3.client_id}")
            assert view["expiry_interval"] == 90
        finally:
            v3.close()
        assert broker.terminate() == 0
    finally:
        broker.kill()


def test_sigterm_with_connected_clients_exits_zero(paho_client, start_broker) -> None:
    broker = start_broker()
    client = paho_client(port=broker.tcp, version=5)
    client.subscribe("bye/#", 1)
    old = paho_client(port=broker.tcp, version=4)
    assert broker.stop() == 0
    client.wait_disconnected()
    old.wait_disconnected()
    assert any("stopping" in line for line in broker.log_lines)
    assert not any("Traceback" in line for line in broker.log_lines)


def test_port_in_use_fails_with_exit_code_one(tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("run", *_sets({**LOOPBACK, "node.data_dir": str(tmp_path),
                                        "listeners.tcp.default.bind": f"127.0.0.1:{port}"}))
    assert result.returncode == 1, result.stderr
    assert "cannot start" in result.stderr


def test_config_docs_lists_every_key() -> None:
    result = run_cli("config", "docs")
    assert result.returncode == 0, result.stderr
    for setting in SETTINGS:
        assert f"| `{setting.key}` |" in result.stdout
