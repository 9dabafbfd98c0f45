"""Starts and stops the brokers under test: ours, Mosquitto and amqtt.

Each broker gets its own free loopback port and temp dir, is declared ready only once it
answers a real MQTT CONNECT with a CONNACK (a sleep would either waste time or race), and is
stopped by PID (SIGTERM, then SIGKILL after a timeout), always, from a `finally`.

The broker is pinned to CPU 0 and the load generator to the other CPUs (when there are at least
two; `set_pinning(False)` turns it off): all three brokers are single-threaded event loops, so
this gives each the same dedicated core and keeps the generator from stealing it.
"""

import argparse
import contextlib
import os
import pwd
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench import wire

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
OURS_BIN = REPO_DIR / ".venv" / "bin" / "broker"
MOSQUITTO_BIN = Path("/usr/sbin/mosquitto")
AMQTT_VENV = BENCH_DIR / ".venv-amqtt"
AMQTT_BIN = AMQTT_VENV / "bin" / "amqtt"

BROKER_CPU = 0
_pinning = True
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0


class BrokerUnavailable(RuntimeError):
    """The broker cannot be run here (not installed) or did not come up."""


def free_port() -> int:
    """A currently unused loopback TCP port (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Launch:
    argv: list[str]
    port: int


def _ours(tmp: Path) -> Launch:
    if not OURS_BIN.exists():
        raise BrokerUnavailable(f"{OURS_BIN} does not exist (project not installed)")
    data_dir = tmp / "data"
    data_dir.mkdir()
    port, ws_port, http_port = free_port(), free_port(), free_port()
    argv = [
        str(OURS_BIN), "run",
        "--set", f"listeners.tcp.default.bind=127.0.0.1:{port}",
        "--set", f"listeners.ws.default.bind=127.0.0.1:{ws_port}",
        "--set", f"dashboard.listeners.http.bind=127.0.0.1:{http_port}",
        "--set", f"node.data_dir={data_dir}",
    ]
    return Launch(argv, port)


def _mosquitto_with(tmp: Path, settings: str) -> Launch:
    if not MOSQUITTO_BIN.exists():
        raise BrokerUnavailable(f"{MOSQUITTO_BIN} not found (apt-get install mosquitto)")
    port = free_port()
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n{settings}")
    return Launch([str(MOSQUITTO_BIN), "-c", str(conf)], port)


def _mosquitto(tmp: Path) -> Launch:
    # Defaults for everything but the listener: no persistence, max_inflight_messages 20,
    # max_queued_messages 1000 (the QoS 1 windows in scenarios.py stay below that).
    return _mosquitto_with(tmp, "")


def _mosquitto_persistent(tmp: Path) -> Launch:
    """What Mosquitto needs to keep persistent sessions' queues across a restart and to
    queue without a limit, as ours does with its defaults (durable_bench.py).

    `user`: started as root, Mosquitto drops to user `mosquitto`, which cannot write its
    database into our temp dir and so loses everything at a restart; it must stay the user
    that owns the dir (the option is ignored when not started as root)."""
    user = pwd.getpwuid(os.getuid()).pw_name
    return _mosquitto_with(
        tmp, f"persistence true\npersistence_location {tmp}/\nmax_queued_messages 0\n"
             f"user {user}\n"
    )


def _amqtt(tmp: Path) -> Launch:
    if not AMQTT_BIN.exists():
        raise BrokerUnavailable("amqtt is not installed: run bench/setup.sh")
    port = free_port()
    conf = tmp / "amqtt.yaml"
    # Only the anonymous-auth plugin: the default config also loads packet/event logger plugins
    # and $SYS publishing, which would charge amqtt for work the other brokers don't do.
    conf.write_text(
        "listeners:\n"
        "  default:\n"
        "    type: tcp\n"
        f"    bind: 127.0.0.1:{port}\n"
        "plugins:\n"
        "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
        "    allow_anonymous: true\n"
    )
    return Launch([str(AMQTT_BIN), "-c", str(conf)], port)


LAUNCHERS: dict[str, Callable[[Path], Launch]] = {
    "ours": _ours,
    "mosquitto": _mosquitto,
    "amqtt": _amqtt,
}
PERSISTENT_LAUNCHERS: dict[str, Callable[[Path], Launch]] = {
    "ours": _ours,  # durable sessions are on by default
    "mosquitto": _mosquitto_persistent,
}


def _output(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + done.stderr).strip()


def version(name: str) -> str:
    """Best-effort version string of a broker, for the results' environment section."""
    if name == "mosquitto":
        first = _output([str(MOSQUITTO_BIN), "-h"]).splitlines()
        return first[0].removeprefix("mosquitto version ").strip() if first else "unknown"
    if name == "amqtt":
        return _output([str(AMQTT_BIN), "--version"]) or "not installed"
    python = REPO_DIR / ".venv" / "bin" / "python"
    ours = _output([
        str(python), "-c",
        "import importlib.metadata as m; print(m.version('durable-mqtt-broker'))",
    ]).splitlines()
    sha = _output(["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"])
    label = ours[-1] if ours and " " not in ours[-1] else "unknown"
    return f"{label} (git {sha})" if sha and " " not in sha else label


@dataclass(slots=True)
class Running:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    tmp: Path
    log: Path
    argv: list[str]
    ready_s: float = 0.0  # from spawning the process to its first CONNACK

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def set_pinning(enabled: bool) -> None:
    global _pinning
    _pinning = enabled


def pinned() -> bool:
    return _pinning and len(os.sched_getaffinity(0)) > 1


def _pin_and_raise_nofile() -> None:
    """Runs in the broker child before exec: own core, and fd limit up to the hard limit."""
    if pinned():
        os.sched_setaffinity(0, {BROKER_CPU})
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def load_cpus() -> set[int]:
    """CPUs the load generator may use: all but the broker's when pinning."""
    cpus = set(os.sched_getaffinity(0))
    return cpus - {BROKER_CPU} if pinned() else cpus


def probe(port: int, client_id: str = "bench-probe", timeout: float = 1.0) -> bool:
    """True if the port answers an MQTT 3.1.1 CONNECT with a successful CONNACK."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(wire.connect(client_id))
            reply = wire.recv_exact(sock, wire.CONNACK_SIZE)
    except OSError:
        return False
    try:
        packet = wire.decode_one(reply)
    except Exception:
        return False
    return getattr(packet, "reason_code", 1) == 0


def _wait_ready(broker: Running, interval: float = 0.05) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    attempt = 0
    while time.monotonic() < deadline:
        if not broker.alive():
            raise BrokerUnavailable(
                f"{broker.name} exited with {broker.proc.returncode} before accepting "
                f"connections:\n{broker.log_tail()}"
            )
        attempt += 1
        if probe(broker.port, f"bench-probe-{attempt}"):
            return
        time.sleep(interval)
    raise BrokerUnavailable(
        f"{broker.name} did not answer CONNECT within {READY_TIMEOUT:.0f}s:\n{broker.log_tail()}"
    )


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
          timeout: float = STOP_TIMEOUT) -> None:
    """Signal the broker's PID, SIGKILL it if it is still there after `timeout`."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(STOP_TIMEOUT)


def _spawn(argv: list[str], tmp: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        # Output goes to a file, never a pipe: an unread pipe would block a chatty broker.
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=tmp, start_new_session=True, preexec_fn=_pin_and_raise_nofile,
        )


RESTART_POLL = 0.01
"""Probe interval while timing a restart: the figure is only as precise as this."""


def restart(broker: Running, sig: int, stop_timeout: float = 120.0) -> tuple[float, float]:
    """Stop the broker with `sig`, start it again on the same data and ports; returns
    (seconds until the old process exited, seconds from the new one's start to its first
    CONNACK). The stop timeout is long because a broker may write its whole queue on the
    way out (Mosquitto's persistence does); running past it SIGKILLs, which the caller sees
    as a stop time at the timeout."""
    started = time.monotonic()
    _stop(broker.proc, sig, stop_timeout)
    stopped = time.monotonic()
    broker.proc = _spawn(broker.argv, broker.tmp, broker.log)
    _wait_ready(broker, RESTART_POLL)
    broker.ready_s = time.monotonic() - stopped
    return stopped - started, broker.ready_s


@contextlib.contextmanager
def running(name: str, persistent: bool = False) -> Iterator[Running]:
    """Start broker `name`, wait until it accepts MQTT, yield it; stop it and clean up after.

    `persistent`: configured to keep persistent sessions and their queues across restarts
    (PERSISTENT_LAUNCHERS)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    broker: Running | None = None
    try:
        launch = (PERSISTENT_LAUNCHERS if persistent else LAUNCHERS)[name](tmp)
        log = tmp / "broker.log"
        spawned = time.monotonic()
        broker = Running(name, launch.port, _spawn(launch.argv, tmp, log), tmp, log,
                         launch.argv)
        _wait_ready(broker, RESTART_POLL)
        broker.ready_s = time.monotonic() - spawned
        yield broker
    finally:
        if broker is not None:
            _stop(broker.proc)
        shutil.rmtree(tmp, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser, names: tuple[str, ...],
                  output: Path) -> None:
    """The options every side-by-side benchmark shares (run.py, durable_bench.py)."""
    parser.add_argument("--brokers", default=",".join(names),
                        help="comma-separated subset of: " + ",".join(names))
    parser.add_argument("--no-pin", action="store_true",
                        help="let the OS schedule broker and generator on any CPU")
    parser.add_argument("--output", type=Path, default=output, help="results JSON path")


def chosen(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """The brokers named by --brokers, in that order; also applies --no-pin."""
    picked = [b.strip() for b in args.brokers.split(",") if b.strip()]
    if bad := [b for b in picked if b not in names]:
        raise SystemExit(f"unknown broker(s) {bad}; choose from {', '.join(names)}")
    set_pinning(not args.no_pin)
    return picked
