"""Starts and stops the brokers under test: ours, Mosquitto and amqtt, and clusters of ours
and of RabbitMQ (cluster_bench.py).

Each broker gets its own free loopback port and temp dir, is declared ready only once it
answers a real MQTT CONNECT with a CONNACK (a sleep would either waste time or race), and is
stopped by PID (SIGTERM, then SIGKILL after a timeout), always, from a `finally`.

The broker is pinned to CPU 0 and the load generator to the other CPUs (when there are at least
two; `set_pinning(False)` turns it off): all three brokers are single-threaded event loops, so
this gives each the same dedicated core and keeps the generator from stealing it.
"""

import argparse
import compileall
import contextlib
import functools
import json
import os
import pwd
import random
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import procstat, wire

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
OURS_BIN = REPO_DIR / ".venv" / "bin" / "broker"
MOSQUITTO_BIN = Path("/usr/sbin/mosquitto")
AMQTT_VENV = BENCH_DIR / ".venv-amqtt"
AMQTT_BIN = AMQTT_VENV / "bin" / "amqtt"
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
"""Debian's real scripts: /usr/sbin's wrappers `su` to user rabbitmq with its own HOME and
send the output to /var/log, which would lose our per-node environment and log."""
RABBITMQ_USER = "rabbitmq"
EPMD_BIN = Path("/usr/bin/epmd")

BROKER_CPU = 0
_pinning = True
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0


class BrokerUnavailable(RuntimeError):
    """The broker cannot be run here (not installed) or did not come up."""


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """An unused loopback TCP port from below the kernel's ephemeral range. A broker keeps
    its ports across restarts (a node killed and started again, the failover and catch-up
    runs): a port in that range can be handed to any port-0 listener or outgoing connection
    while the broker is down, and its restart would then fail to bind. A port is handed out
    once per process: a node's ports are picked before the nodes started earlier bound
    theirs, so the probe alone could give two of them the same one."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(max(1024, ephemeral_low - 16384), ephemeral_low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


@dataclass(frozen=True, slots=True)
class Launch:
    argv: list[str]
    port: int
    http_port: int = 0  # ours: the HTTP API (cluster readiness, metrics)
    credentials: tuple[str, str] | None = None
    """User name and password of the readiness probe, for a broker that refuses anonymous
    clients (security_bench.py)."""
    env: dict[str, str] | None = None  # None: this process's environment


@functools.cache
def _compile_bytecode() -> None:
    """Ours runs from compiled bytecode, as an installed wheel does (pip compiles it): with
    PYTHONDONTWRITEBYTECODE set and no `__pycache__`, every start would compile the
    sources again, and start-up figures would measure the compiler."""
    compileall.compile_dir(REPO_DIR / "broker", quiet=1)


def _ours(tmp: Path, settings: dict[str, str] | None = None) -> Launch:
    if not OURS_BIN.exists():
        raise BrokerUnavailable(f"{OURS_BIN} does not exist (project not installed)")
    _compile_bytecode()
    data_dir = tmp / "data"
    data_dir.mkdir()
    port, ws_port, http_port = free_port(), free_port(), free_port()
    argv = [
        str(OURS_BIN), "run",
        "--set", f"listeners.tcp.default.bind=127.0.0.1:{port}",
        "--set", f"listeners.ws.default.bind=127.0.0.1:{ws_port}",
        "--set", f"dashboard.listeners.http.bind=127.0.0.1:{http_port}",
        "--set", f"node.data_dir={data_dir}",
        # The inter-node listener too: on loopback, on a free port (the default 0.0.0.0:5369
        # would collide with any other broker running on this machine).
        "--set", "rpc.listen_address=127.0.0.1", "--set", "rpc.tcp_server_port=0",
    ]
    for key, value in (settings or {}).items():
        argv += ["--set", f"{key}={value}"]
    return Launch(argv, port, http_port, env=_ours_env())


def _ours_env() -> dict[str, str]:
    """The venv's `broker` imports the editable install's tree, which need not be the tree
    this bench belongs to (another checkout sharing the venv): ours runs this tree, or the
    one PYTHONPATH names (a pure-Python copy, say)."""
    return {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or str(REPO_DIR)}


def _mosquitto_with(tmp: Path, settings: str,
                    credentials: tuple[str, str] | None = None) -> Launch:
    if not MOSQUITTO_BIN.exists():
        raise BrokerUnavailable(f"{MOSQUITTO_BIN} not found (apt-get install mosquitto)")
    port = free_port()
    conf = tmp / "mosquitto.conf"
    anonymous = "" if "allow_anonymous" in settings else "allow_anonymous true\n"
    conf.write_text(f"listener {port} 127.0.0.1\n{anonymous}{settings}")
    return Launch([str(MOSQUITTO_BIN), "-c", str(conf)], port, credentials=credentials)


def ours_with(settings: dict[str, str],
              credentials: tuple[str, str] | None = None) -> Callable[[Path], Launch]:
    """A launcher of ours with these settings on top of the benchmark's (`running`)."""
    def launch(tmp: Path) -> Launch:
        plain = _ours(tmp, settings)
        return Launch(plain.argv, plain.port, plain.http_port, credentials, plain.env)

    return launch


def mosquitto_with(settings: str,
                   credentials: tuple[str, str] | None = None) -> Callable[[Path], Launch]:
    """A launcher of Mosquitto with these configuration lines (`running`); without an
    `allow_anonymous` line of their own, anonymous clients are allowed."""
    return lambda tmp: _mosquitto_with(tmp, settings, credentials)


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
    if name == "rabbitmq":
        return _output(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"]) or "unknown"
    python = REPO_DIR / ".venv" / "bin" / "python"
    ours = _output([str(python), "-m", "broker", "--version"]).splitlines()
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
    http_port: int = 0
    node: str = ""  # a cluster member's node name
    worker_pid: int | None = None
    """The process doing the work when `proc` is a wrapper that waits on it (RabbitMQ's start
    script and its beam.smp): the one whose CPU is measured and that must not outlive us."""
    credentials: tuple[str, str] | None = None  # the readiness probe's (`Launch`)
    env: dict[str, str] | None = None  # how `proc` was started, to start it again
    user: str | None = None

    @property
    def pid(self) -> int:
        return self.worker_pid or self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None and (self.worker_pid is None
                                            or os.path.exists(f"/proc/{self.worker_pid}"))

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


def probe(port: int, client_id: str = "bench-probe", timeout: float = 1.0,
          credentials: tuple[str, str] | None = None) -> bool:
    """True if the port answers an MQTT 3.1.1 CONNECT with a successful CONNACK."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(wire.connect(client_id, credentials=credentials))
            reply = wire.recv_exact(sock, wire.CONNACK_SIZE)
    except OSError:
        return False
    try:
        packet = wire.decode_one(reply)
    except Exception:
        return False
    return getattr(packet, "reason_code", 1) == 0


def _wait_ready(broker: Running, interval: float = 0.05, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    attempt = 0
    while time.monotonic() < deadline:
        if not broker.alive():
            raise BrokerUnavailable(
                f"{broker.name} exited with {broker.proc.returncode} before accepting "
                f"connections:\n{broker.log_tail()}"
            )
        attempt += 1
        if probe(broker.port, f"bench-probe-{attempt}", credentials=broker.credentials):
            return
        time.sleep(interval)
    raise BrokerUnavailable(
        f"{broker.name} did not answer CONNECT within {timeout:.0f}s:\n{broker.log_tail()}"
    )


def wait_started(broker: Running, timeout: float = READY_TIMEOUT) -> None:
    """Returns once the broker's start-up is over. Ours answers CONNECTs before it is: its
    HTTP API's modules are imported on a worker thread meanwhile (~0.3 s of CPU, which
    takes the GIL from the event loop; server/http_listener.py), and the collector then
    freezes what start-up built. A rate measured from the first CONNACK on would measure
    that too. Over once the API answers `/api/v5/status`; at once for the other brokers."""
    if not broker.http_port:
        return
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{broker.http_port}/api/v5/status"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                response.read()
            return
        except OSError:  # not listening yet (URLError is an OSError)
            if time.monotonic() > deadline or not broker.alive():
                raise BrokerUnavailable(f"{broker.name}'s HTTP API did not answer within"
                                        f" {timeout:.0f}s:\n{broker.log_tail()}") from None
            time.sleep(0.05)


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


def _spawn(argv: list[str], tmp: Path, log: Path, env: dict[str, str] | None = None,
           user: str | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        # Output goes to a file, never a pipe: an unread pipe would block a chatty broker.
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=tmp, start_new_session=True, preexec_fn=_pin_and_raise_nofile, env=env,
            user=user, group=user,
        )


RESTART_POLL = 0.01
"""Probe interval while timing a restart: the figure is only as precise as this."""


def stop(broker: Running, sig: int, timeout: float = STOP_TIMEOUT) -> None:
    """Stop the broker's process with `sig` (SIGKILL past `timeout`), to start it again
    with `respawn` (offline_bench.py times its way back up itself)."""
    _stop(broker.proc, sig, timeout)


def respawn(broker: Running) -> None:
    """Start a broker whose process has exited again, on the same data and ports, without
    waiting for it (replication_bench.py watches an emptied node catch up meanwhile)."""
    broker.proc = _spawn(broker.argv, broker.tmp, broker.log, broker.env, broker.user)
    broker.worker_pid = None  # a wrapper's worker is looked up again (`restart`)


def restart(broker: Running, sig: int, stop_timeout: float = 120.0) -> tuple[float, float]:
    """Stop the broker with `sig`, start it again on the same data and ports; returns
    (seconds until the old process exited, seconds from the new one's start to its first
    CONNACK). The stop timeout is long because a broker may write its whole queue on the
    way out (Mosquitto's persistence does); running past it SIGKILLs, which the caller sees
    as a stop time at the timeout."""
    started = time.monotonic()
    _stop(broker.proc, sig, stop_timeout)
    stopped = time.monotonic()
    wrapped = broker.worker_pid is not None
    respawn(broker)
    _wait_ready(broker, RESTART_POLL)
    if wrapped:
        broker.worker_pid = _beam(broker.proc)
    broker.ready_s = time.monotonic() - stopped
    return stopped - started, broker.ready_s


@contextlib.contextmanager
def running(name: str, persistent: bool = False,
            launcher: Callable[[Path], Launch] | None = None) -> Iterator[Running]:
    """Start broker `name`, wait until it accepts MQTT, yield it; stop it and clean up after.

    `persistent`: configured to keep persistent sessions and their queues across restarts
    (PERSISTENT_LAUNCHERS). `launcher`: this one instead of the name's (`ours_with`,
    `mosquitto_with`)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    broker: Running | None = None
    try:
        launch = (launcher or (PERSISTENT_LAUNCHERS if persistent else LAUNCHERS)[name])(tmp)
        log = tmp / "broker.log"
        spawned = time.monotonic()
        broker = Running(name, launch.port, _spawn(launch.argv, tmp, log, launch.env), tmp,
                         log, launch.argv, http_port=launch.http_port,
                         credentials=launch.credentials, env=launch.env)
        _wait_ready(broker, RESTART_POLL)
        broker.ready_s = time.monotonic() - spawned
        yield broker
    finally:
        if broker is not None:
            _stop(broker.proc)
        shutil.rmtree(tmp, ignore_errors=True)


CLUSTER_READY_TIMEOUT = 120.0
"""Nodes start at once on a shared 2-core machine; a RabbitMQ node takes ~10 s alone, and
joining a cluster restarts its application."""
LOOPBACK_DIST = "-kernel inet_dist_use_interface {127,0,0,1}"
"""Erlang distribution listens on every address unless told otherwise."""


def http_json(port: int, path: str) -> dict[str, Any]:
    """A JSON object from ours' HTTP API on loopback (an empty one for any other JSON)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        body = json.loads(response.read())
    return body if isinstance(body, dict) else {}


def _until(ready: Callable[[], bool], members: list[Running], what: str,
           deadline: float) -> None:
    """Poll `ready` until it holds; fail as soon as a member died or the deadline passed."""
    while not ready():
        if dead := [m for m in members if not m.alive()]:
            raise BrokerUnavailable(f"{dead[0].node} exited while {what}:\n"
                                    f"{dead[0].log_tail()}")
        if time.monotonic() > deadline:
            raise BrokerUnavailable(f"no {what} within {CLUSTER_READY_TIMEOUT:.0f}s:\n"
                                    f"{members[0].log_tail()}")
        time.sleep(0.1)


def _ours_cluster(tmp: Path, nodes: int, members: list[Running],
                  helpers: list[subprocess.Popen[bytes]], settings: dict[str, str]) -> None:
    """Ours as in tests/cluster: static seeds naming every node, a fresh cookie per run, the
    inter-node listener on loopback; ready once every node has a link to each other one
    (its readiness probe alone also turns 200 when it gave up on a seed). `settings` go on
    top (replication_bench.py: the replicated backend)."""
    rpc_ports = [free_port() for _ in range(nodes)]
    names = [f"bench{i + 1}@127.0.0.1" for i in range(nodes)]
    seeds = ",".join(f"{n}:{p}" for n, p in zip(names, rpc_ports, strict=True))
    cookie = secrets.token_hex(16)
    for name, rpc_port in zip(names, rpc_ports, strict=True):
        node_tmp = tmp / name.partition("@")[0]
        node_tmp.mkdir()
        launch = _ours(node_tmp, {
            "node.name": name, "node.cookie": cookie, "rpc.listen_address": "127.0.0.1",
            "rpc.tcp_server_port": str(rpc_port), "cluster.discovery_strategy": "static",
            "cluster.static.seeds": seeds, **settings,
        })
        log = node_tmp / "broker.log"
        members.append(Running("ours", launch.port,
                               _spawn(launch.argv, node_tmp, log, launch.env), node_tmp, log,
                               launch.argv, http_port=launch.http_port, node=name,
                               env=launch.env))
    deadline = time.monotonic() + CLUSTER_READY_TIMEOUT

    for member in members:
        _wait_ready(member, timeout=max(1.0, deadline - time.monotonic()))

        def linked(m: Running = member) -> bool:
            try:
                return http_json(m.http_port, "/api/v5/ready").get("peers") == nodes - 1
            except (OSError, ValueError):  # not listening yet, or 503 (an HTTPError)
                return False

        _until(linked, members, "full mesh", deadline)


def _rabbitmq_env(tmp: Path, epmd_port: int) -> dict[str, str]:
    """What every RabbitMQ process of one cluster shares, CLI included: the cookie in HOME
    (3.10 still reads RABBITMQ_ERLANG_COOKIE but warns that it is going away), and a private
    epmd on loopback, so nothing of another Erlang node on the machine is touched."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
            "HOME": str(tmp / "home"), "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": LOOPBACK_DIST,
            "RABBITMQ_CTL_ERL_ARGS": LOOPBACK_DIST}


def _rabbitmqctl(env: dict[str, str], tmp: Path, node: str, *args: str) -> str:
    argv = [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node, *args]
    try:
        done = subprocess.run(argv, env=env, cwd=tmp, user=RABBITMQ_USER, group=RABBITMQ_USER,
                              capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BrokerUnavailable(f"{' '.join(argv)} timed out") from exc
    if done.returncode:
        raise BrokerUnavailable(f"{' '.join(argv)} exited with {done.returncode}: "
                                f"{(done.stdout + done.stderr).strip()[-500:]}")
    return done.stdout


def rabbitmqctl(member: Running, *args: str) -> str:
    """`rabbitmqctl` against a member of a RabbitMQ cluster (`running_cluster`): its
    output."""
    assert member.env is not None, "not a RabbitMQ cluster member"
    return _rabbitmqctl(member.env, member.tmp, member.node, *args)


def _beam(script: subprocess.Popen[bytes]) -> int | None:
    """The node's Erlang VM: the start script's child once it has exec'ed into beam.smp."""
    for child in procstat.children(script.pid):
        if procstat.command_name(child).startswith("beam"):
            return child
    return None


def _rabbitmq_cluster(tmp: Path, nodes: int, members: list[Running],
                      helpers: list[subprocess.Popen[bytes]], settings: dict[str, str]) -> None:
    """RabbitMQ 3.10 nodes with the MQTT plugin, each with its own ports, data, log and
    config, run as user rabbitmq (which owns the temp dir), joined to the first node the
    documented way: stop_app, join_cluster, start_app. `settings` are more rabbitmq.conf
    lines (replication_bench.py: `mqtt.durable_queue_type = quorum`)."""
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        raise BrokerUnavailable("rabbitmq-server is not installed: run bench/setup.sh")
    account = pwd.getpwnam(RABBITMQ_USER)
    epmd_port = free_port()
    env = _rabbitmq_env(tmp, epmd_port)
    (tmp / "home").mkdir()
    cookie = tmp / "home" / ".erlang.cookie"
    cookie.write_text(secrets.token_hex(16))
    cookie.chmod(0o400)
    launches: list[tuple[str, int, dict[str, str], Path]] = []
    for i in range(nodes):
        node, node_tmp = f"bench{i + 1}@localhost", tmp / f"bench{i + 1}"
        node_tmp.mkdir()
        mqtt_port = free_port()
        (node_tmp / "rabbitmq.conf").write_text(
            f"mqtt.listeners.tcp.default = 127.0.0.1:{mqtt_port}\n"
            "mqtt.allow_anonymous = true\n"
            + "".join(f"{key} = {value}\n" for key, value in settings.items())
        )
        (node_tmp / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        launches.append((node, mqtt_port, {
            **env, "RABBITMQ_NODENAME": node, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(free_port()), "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(node_tmp / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node_tmp / "log"),
            "RABBITMQ_CONFIG_FILE": str(node_tmp / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(node_tmp / "enabled_plugins"),
        }, node_tmp))
    for path in (tmp, *tmp.rglob("*")):
        os.chown(path, account.pw_uid, account.pw_gid)
    epmd_log = tmp / "epmd.log"
    helpers.append(_spawn([str(EPMD_BIN), "-port", str(epmd_port)], tmp, epmd_log, env,
                          RABBITMQ_USER))
    _wait_port(epmd_port, "epmd", helpers[0], epmd_log)
    for node, mqtt_port, node_env, node_tmp in launches:
        argv = [str(RABBITMQ_BIN / "rabbitmq-server")]
        log = node_tmp / "broker.log"
        members.append(Running("rabbitmq", mqtt_port,
                               _spawn(argv, node_tmp, log, node_env, RABBITMQ_USER),
                               node_tmp, log, argv, node=node, env=node_env,
                               user=RABBITMQ_USER))
    deadline = time.monotonic() + CLUSTER_READY_TIMEOUT
    for member in members:
        def found(m: Running = member) -> bool:
            m.worker_pid = _beam(m.proc)
            return m.worker_pid is not None

        _until(found, members, f"beam.smp under {member.node}'s start script", deadline)
        _wait_ready(member, timeout=max(1.0, deadline - time.monotonic()))
    first = members[0].node
    for (node, _, node_env, node_tmp), member in zip(launches[1:], members[1:], strict=True):
        for args in (("stop_app",), ("join_cluster", first), ("start_app",)):
            _rabbitmqctl(node_env, node_tmp, node, *args)
        _wait_ready(member, timeout=max(1.0, deadline - time.monotonic()))
    _rabbitmqctl(launches[0][2], tmp, first, "await_online_nodes", str(nodes))


def _wait_port(port: int, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise BrokerUnavailable(f"{what} did not listen on {port}: "
                                    f"{log.read_text(errors='replace')[-500:]}")
        time.sleep(0.05)


CLUSTER_LAUNCHERS: dict[
    str, Callable[[Path, int, list[Running], list[subprocess.Popen[bytes]], dict[str, str]],
                  None]
] = {
    "ours": _ours_cluster,
    "rabbitmq": _rabbitmq_cluster,
}
CLUSTER_STOP_TIMEOUT = 60.0
"""A RabbitMQ node leaving a cluster takes a few seconds on an idle machine."""


def _stop_members(members: list[Running]) -> None:
    """SIGTERM to every node at once (graceful for both: RabbitMQ's VM stops its
    application, and its start script exits once the VM has), then wait for each and
    SIGKILL what is left: the script, and its VM if that outlived it."""
    for member in members:
        if member.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(member.pid, signal.SIGTERM)
    for member in members:
        try:
            member.proc.wait(CLUSTER_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            member.proc.kill()
            member.proc.wait(STOP_TIMEOUT)
        worker = member.worker_pid
        if worker is not None and procstat.command_name(worker).startswith("beam"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)


@contextlib.contextmanager
def running_cluster(name: str, nodes: int,
                    settings: dict[str, str] | None = None) -> Iterator[list[Running]]:
    """Start an `nodes`-node cluster of broker `name` on loopback, yield its members once
    every node accepts MQTT and the cluster is formed; stop every process started (by PID,
    also on failure) and remove the temp dir. `settings`: more configuration, in the
    broker's own keys, for every node."""
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{name}-cluster-"))
    members: list[Running] = []
    helpers: list[subprocess.Popen[bytes]] = []
    try:
        CLUSTER_LAUNCHERS[name](tmp, nodes, members, helpers, settings or {})
        yield members
    finally:
        _stop_members(members)
        for helper in helpers:
            _stop(helper)
        shutil.rmtree(tmp, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser, names: tuple[str, ...],
                  output: Path, pinning: bool = True) -> None:
    """The options every side-by-side benchmark shares (run.py, durable_bench.py;
    cluster_bench.py without `--no-pin`: its nodes are never pinned)."""
    parser.add_argument("--brokers", default=",".join(names),
                        help="comma-separated subset of: " + ",".join(names))
    if pinning:
        parser.add_argument("--no-pin", action="store_true",
                            help="let the OS schedule broker and generator on any CPU")
    parser.add_argument("--output", type=Path, default=output, help="results JSON path")


def chosen(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """The brokers named by --brokers, in that order; also applies --no-pin (no pinning at
    all where the option was not offered)."""
    picked = [b.strip() for b in args.brokers.split(",") if b.strip()]
    if bad := [b for b in picked if b not in names]:
        raise SystemExit(f"unknown broker(s) {bad}; choose from {', '.join(names)}")
    set_pinning("no_pin" in args and not args.no_pin)
    return picked
