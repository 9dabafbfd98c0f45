"""`node.cookie_file`: the cookie read from a file (a mounted Kubernetes Secret), so it is in
neither the config file nor the command line; a configured file that is missing or empty
stops the start instead of leaving the node alone with a random cookie."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cluster.service import load_cookie
from broker.config.loader import Config, load_config
from broker.ds import files


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


def test_a_made_cookie_is_never_readable_by_others(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Written with mode 0600 from its creation: a chmod after the write left a moment where
    others could read it. Each file is looked at when it is synced (before its rename),
    with a umask that masks nothing, and a temporary file an earlier crash left
    world-readable does not lend the cookie its mode."""
    cluster_dir = tmp_path / "data" / "cluster"
    cluster_dir.mkdir(parents=True)
    stale = cluster_dir / "cookie.tmp"
    stale.write_text("left by a crash")
    stale.chmod(0o666)
    modes: list[int] = []
    sync = os.fsync

    def looked_at(fd: int) -> None:
        st_mode = os.fstat(fd).st_mode
        if stat.S_ISREG(st_mode):  # (not the directories, synced after renames)
            modes.append(stat.S_IMODE(st_mode))
        sync(fd)

    monkeypatch.setattr(files.os, "fsync", looked_at)
    old = os.umask(0)
    try:
        load_cookie(config(tmp_path), cluster_dir)
    finally:
        os.umask(old)
    made = list(cluster_dir.iterdir())
    assert [path.name for path in made] == ["cookie"]
    assert stat.S_IMODE(made[0].stat().st_mode) == 0o600
    assert modes == [0o600]
