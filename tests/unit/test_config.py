from pathlib import Path

import pytest

from broker.config.loader import ConfigError, load_config
from broker.config.schema import SETTINGS, render_markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_defaults_are_the_documented_emqx_values() -> None:
    config = load_config()
    assert config["listeners.tcp.default.bind"] == ("0.0.0.0", 1883)
    assert config["listeners.ws.default.bind"] == ("0.0.0.0", 8083)
    assert config["dashboard.listeners.http.bind"] == ("0.0.0.0", 18083)
    assert config["mqtt.session_expiry_interval"] == 7200
    assert config["mqtt.max_packet_size"] == 1024 * 1024
    assert config["mqtt.max_mqueue_len"] == 1000


def test_toml_file_then_set_overrides(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[mqtt]\nsession_expiry_interval = "30s"\nmax_packet_size = "64KB"\n'
                    '[retainer]\nmax_retained_messages = 5\n')
    config = load_config(path, ["mqtt.session_expiry_interval=1d", "listeners.ws.default.bind=off"])
    assert config["mqtt.session_expiry_interval"] == 86400
    assert config["mqtt.max_packet_size"] == 65536
    assert config["retainer.max_retained_messages"] == 5
    assert config["listeners.ws.default.bind"] is None


@pytest.mark.parametrize(("override", "named"), [
    ("mqtt.no_such_key=1", "mqtt.no_such_key"),
    ("mqtt.max_packet_size=lots", "mqtt.max_packet_size"),
    ("mqtt.session_expiry_interval=-5", "mqtt.session_expiry_interval"),
    ("mqtt.max_inflight=0", "mqtt.max_inflight"),
    ("retainer.enable=maybe", "retainer.enable"),
    ("listeners.tcp.default.bind=host:99999", "listeners.tcp.default.bind"),
])
def test_bad_key_or_value_is_rejected_naming_the_key(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, [override])


def test_bad_toml_key_is_rejected_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("[mqtt]\nmax_qos_allowed = 3\n")
    with pytest.raises(ConfigError, match=r"mqtt\.max_qos_allowed"):
        load_config(path)


def test_readme_documents_every_key_with_its_default() -> None:
    assert render_markdown_table() in README.read_text()
    assert len(SETTINGS) == len({s.key for s in SETTINGS})


def test_wildcard_thresholds_from_toml_list_and_from_set(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("[durable_storage.messages.layout]\nwildcard_thresholds = [50, 5, 2]\n")
    key = "durable_storage.messages.layout.wildcard_thresholds"
    assert load_config()[key] == (100, 10)
    assert load_config(path)[key] == (50, 5, 2)
    assert load_config(None, [f"{key}=7,3"])[key] == (7, 3)
    for bad in ("[]", "1,x", "0"):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [f"{key}={bad}"])
