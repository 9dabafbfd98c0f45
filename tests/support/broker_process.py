"""Runs the real `broker` CLI as a subprocess for integration tests.

Every listener binds 127.0.0.1:0; the ports are read from the broker's own start-up log
lines, so tests neither guess free ports nor sleep while waiting for it to come up.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.procstat import rss_kib

LISTENER = re.compile(r"(?:listener (\w+)|(HTTP) API) on [\d.]+:(\d+)")
# "broker NAME started (...)": not any line that says both (a data dir path may)
STARTED = re.compile(r"\bbroker \S+ started \(")


@dataclass
class BrokerProcess:
    data_dir: Path
    settings: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None
    # Another release's source tree (tests/support/releases.py) to run instead of this one.
    code: Path | None = None

    def command(self) -> list[str]:
        """`broker run` with this node's settings, every listener on loopback."""
        args = [sys.executable, "-m", "broker", "run"]
        base = {
            "listeners.tcp.default.bind": "127.0.0.1:0",
            "listeners.ws.default.bind": "127.0.0.1:0",
            "dashboard.listeners.http.bind": "127.0.0.1:0",
            "rpc.listen_address": "127.0.0.1",
            "rpc.tcp_server_port": "0",
            "node.data_dir": str(self.data_dir),
        }
        for key, value in {**base, **self.settings}.items():
            args += ["--set", f"{key}={value}"]
        return args

    def popen_options(self) -> dict[str, Any]:
        """The environment and working directory `command` runs in: this tree's, or the
        release's in `code`."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.code is not None:
            env["PYTHONPATH"] = str(self.code)
        return {"env": env, "cwd": self.code}

    def start(self, timeout: float = 20.0) -> "BrokerProcess":
        self.ports = {}
        self.proc = subprocess.Popen(
            self.command(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            **self.popen_options(),
        )
        ready = threading.Event()
        threading.Thread(target=self._read_log, args=(ready,), daemon=True).start()
        if not ready.wait(timeout) or self.proc.poll() is not None:
            self.kill()
            raise RuntimeError("broker did not start:\n" + "\n".join(self.log_lines[-30:]))
        return self

    def _read_log(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log_lines.append(line.rstrip())
            match = LISTENER.search(line)
            if match:
                self.ports[(match.group(1) or "http").lower()] = int(match.group(3))
            if STARTED.search(line):
                ready.set()
        ready.set()

    @property
    def tcp(self) -> int:
        return self.ports["tcp"]

    def log_text(self) -> str:
        return "\n".join(self.log_lines)

    def rss(self) -> int:
        """The broker process's resident set (VmRSS), in bytes."""
        assert self.proc is not None
        return rss_kib(self.proc.pid) * 1024

    def metric(self, name: str, **labels: str) -> float:
        """One sample of /metrics (0 when absent: a counter never incremented)."""
        url = f"http://127.0.0.1:{self.ports['http']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
                         if labels else "")
        for line in text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.split()[-1])
        return 0.0

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait: the graceful path; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
