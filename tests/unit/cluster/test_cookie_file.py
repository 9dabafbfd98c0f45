"""`node.cookie_file`: the cookie read from a file (a mounted Kubernetes Secret), so it is in
neither the config file nor the command line; a configured file that is missing or empty
stops the start instead of leaving the node alone with a random cookie."""

import subprocess
import sys
from pathlib import Path

import pytest

from broker.cluster.service import load_cookie
from broker.config.loader import Config, load_config


def config(tmp_path: Path, *overrides: str) -> Config:
    return load_config(None, [f"node.data_dir={tmp_path / 'data'}", *overrides])


def test_the_files_cookie_is_used_and_nothing_is_written(tmp_path: Path) -> None:
    secret = tmp_path / "cookie"
    secret.write_text("from-the-secret\n")
    cluster_dir = tmp_path / "data" / "cluster"
    cookie = load_cookie(config(tmp_path, f"node.cookie_file={secret}"), cluster_dir)
    assert cookie == "from-the-secret"
    assert not cluster_dir.exists()  # no random cookie made and kept beside it


def test_node_cookie_wins_over_the_file(tmp_path: Path) -> None:
    secret = tmp_path / "cookie"
    secret.write_text("from-the-secret")
    settings = config(tmp_path, "node.cookie=inline", f"node.cookie_file={secret}")
    assert load_cookie(settings, tmp_path / "cluster") == "inline"


def test_without_either_a_random_cookie_is_made_once_and_kept(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "data" / "cluster"
    first = load_cookie(config(tmp_path), cluster_dir)
    assert len(first) == 64 and load_cookie(config(tmp_path), cluster_dir) == first


@pytest.mark.parametrize("content", [None, "", "  \n"], ids=["missing", "empty", "blank"])
def test_a_missing_or_empty_file_is_a_start_up_error(tmp_path: Path, content: str | None) -> None:
    secret = tmp_path / "cookie"
    if content is not None:
        secret.write_text(content)
    with pytest.raises(OSError, match=r"node\.cookie_file") as error:
        load_cookie(config(tmp_path, f"node.cookie_file={secret}"), tmp_path / "cluster")
    assert error.value.filename == str(secret)
    assert not (tmp_path / "cluster").exists()


def test_broker_run_refuses_to_start_naming_the_setting(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-cookie"
    done = subprocess.run(
        [sys.executable, "-m", "broker", "run", "--set", f"node.data_dir={tmp_path / 'data'}",
         "--set", f"node.cookie_file={missing}",
         *(arg for key in ("listeners.tcp.default.bind", "listeners.ws.default.bind",
                           "dashboard.listeners.http.bind")
           for arg in ("--set", f"{key}=127.0.0.1:0")),
         "--set", "rpc.listen_address=127.0.0.1", "--set", "rpc.tcp_server_port=0"],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert f"cannot start: [Errno 2] node.cookie_file: No such file or directory: '{missing}'" \
        in done.stderr
