"""Where the HTTP API's keys come from, decided from the configuration alone (no socket is
bound: a test must not listen beyond loopback), and EMQX's bootstrap file format."""

import re
import stat
from pathlib import Path

import pytest

from broker.config.loader import Config, load_config
from broker.http.auth import ADMINISTRATOR, VIEWER, ApiKeyFileError, load_api_keys, parse_api_keys


def config(data_dir: Path, bind: str, keys: Path | None = None) -> Config:
    overrides = [f"node.data_dir={data_dir}", f"dashboard.listeners.http.bind={bind}"]
    if keys is not None:
        overrides.append(f"api_key.bootstrap_file={keys}")
    return load_config(None, overrides)


@pytest.mark.parametrize("bind", ["0.0.0.0:18083", "192.0.2.7:18083", "[::]:18083",
                                  "broker.example:18083"])
def test_a_network_bind_without_a_file_gets_a_private_key_made_once(
        tmp_path: Path, bind: str) -> None:
    keys = load_api_keys(config(tmp_path / "data", bind))
    made = tmp_path / "data" / "api_key"
    text = made.read_text()
    assert re.fullmatch(r"admin:[0-9a-f]{64}\n", text)
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert keys is not None and keys.role(*text.strip().split(":")) == ADMINISTRATOR
    assert keys.role("admin", "0" * 64) is None
    load_api_keys(config(tmp_path / "data", bind))  # a restart keeps the key
    assert made.read_text() == text


@pytest.mark.parametrize("bind", ["127.0.0.1:18083", "127.3.2.1:0", "[::1]:18083",
                                  "localhost:18083"])
def test_a_loopback_bind_without_a_file_stays_open(tmp_path: Path, bind: str) -> None:
    assert load_api_keys(config(tmp_path, bind)) is None
    assert not (tmp_path / "api_key").exists()


def test_a_bootstrap_file_closes_even_a_loopback_api_and_nothing_is_made(
        tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("viewer1:abc:viewer\n")
    keys = load_api_keys(config(tmp_path, "127.0.0.1:0", tmp_path / "keys"))
    assert keys is not None and keys.role("viewer1", "abc") == VIEWER
    assert not (tmp_path / "api_key").exists()


def test_a_missing_bootstrap_file_is_an_error_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ApiKeyFileError, match=r"api_key\.bootstrap_file .*nope"):
        load_api_keys(config(tmp_path, "127.0.0.1:0", tmp_path / "nope"))


def test_bootstrap_file_format_is_emqxs() -> None:
    keys = parse_api_keys("# comment\n\n  b-2:secret-b:viewer \na_1:secret-a\n", "f")
    assert list(keys) == ["b-2", "a_1"]  # file order: `broker ctl --api-key-file` takes b-2
    assert keys["b-2"].role == VIEWER and keys["a_1"].role == ADMINISTRATOR  # EMQX's default
    assert keys["a_1"].secret == b"secret-a"
    with pytest.raises(ApiKeyFileError, match=r"^f:1: a key's name"):
        parse_api_keys("bad name:secret\n", "f")
    for line, why in (("k:hunter2:x:y", "f:1: expected"), ("k:hunter2:root", "f:1: role")):
        with pytest.raises(ApiKeyFileError, match=f"^{why}") as error:
            parse_api_keys(line, "f")
        assert "hunter2" not in str(error.value)  # logged: never the secret
