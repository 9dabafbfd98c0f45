"""Security benchmark (issue 19): what password authentication and an ACL file cost.

    .venv/bin/python bench/security_bench.py [--quick] [--only connect,acl]
                                             [--brokers ours,mosquitto] [--connects N]
                                             [--parallel P] [--rounds R] [--duration S]

connect: CONNECT rate with a password file, ours against Mosquitto 2.0 on the same file
  (`$7$` PBKDF2-SHA512 entries made by `mosquitto_passwd`, else by `broker ctl users add`)
  with anonymous clients refused, and both without one (the same CONNECTs, unchecked);
  ours with JWT authentication instead (HS256 tokens as passwords,
  `authentication.jwt.secret`), SCRAM-SHA-256 (MQTT 5 enhanced authentication,
  `authentication.scram.user_file`, the same users) and HTTP authentication
  (`authentication.http.url`, a minimal aiohttp service answering allow, bench/
  auth_service.py), each against ours with the password file and against Mosquitto's.
  `--parallel` raw sockets at a time each connect, send CONNECT with a user's right
  password, read the CONNACK, send DISCONNECT and wait for the broker to close,
  `--connects` times in all: connections per second, the time from the TCP connect to the
  CONNACK (p50/p99) and the broker's CPU.
acl: QoS 1, 1 -> 1 (bench/run.py's scenario b, its load generator) on ours with a
  `--rules`-rule ACL file against none: messages per second, and their ratio.

Each round starts a fresh broker per case, in turn (ours, Mosquitto; ACL, none), so a drift
of the machine hits both sides alike; a ratio is the median of the rounds' ratios. Writes
bench/security_results.json.
"""

import argparse
import contextlib
import errno
import multiprocessing
import os
import pwd
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, procstat, report, wire
from bench.auth_service import allow_service
from bench.logins import Login, PasswordLogin, ScramLogin
from bench.scenarios import SCENARIOS, Outcome, Timing, throughput
from broker.auth.scram import DEFAULT_ITERATIONS
from broker.auth.scram_users import dump_scram_file, make_user

RESULTS = Path(__file__).resolve().parent / "security_results.json"
JWT_SECRET = "bench-jwt-secret-of-32-bytes-or-more"
ALL_BROKERS = ("ours", "mosquitto")
USERS = 10
"""Users in the password file; client n logs in as user n mod USERS."""
DISCONNECT = wire.DISCONNECT
STORM_TIMEOUT = 300.0


# ---- files ---------------------------------------------------------------------------------
def make_password_file(path: Path, users: list[tuple[str, str]]) -> str:
    """`mosquitto_passwd -c -b` for the first user, `-b` for the others; `broker ctl users
    add` where Mosquitto's tool is not installed. Returns which tool made it."""
    tool = shutil.which("mosquitto_passwd")
    for n, (user, password) in enumerate(users):
        if tool is not None:
            argv = [tool, *(["-c"] if n == 0 else []), "-b", str(path), user, password]
        else:
            argv = [str(brokers.OURS_BIN), "ctl", "users", "add", user, "--file", str(path),
                    "--password", password]
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
    return "mosquitto_passwd" if tool is not None else "broker ctl users add"


def make_acl_file(path: Path, rules: int) -> None:
    """`rules` rule lines in Mosquitto's format, the one that lets the benchmark's anonymous
    clients at `bench/...` last among the anonymous rules, so a decision reads past all the
    others: a third anonymous `topic` rules, a third `pattern` rules (%c, %u), a third
    under `user` lines."""
    third = max(1, rules // 3)
    lines = ["# anonymous clients"]
    lines += [f"topic readwrite fleet/{n}/#" for n in range(rules - 2 * third - 1)]
    lines.append("topic readwrite bench/#")
    lines += [f"pattern readwrite devices/%c/{n}/#" if n % 2 else f"pattern read inbox/%u/{n}"
              for n in range(third)]
    per_user = 3
    for n in range(third):
        if n % per_user == 0:
            lines.append(f"user tenant{n // per_user}")
        lines.append(f"topic {'read' if n % 2 else 'readwrite'} tenants/{n // per_user}/{n}/#")
    path.write_text("\n".join(lines) + "\n")
    counted = sum(1 for line in lines if line.startswith(("topic", "pattern")))
    assert counted == rules, (counted, rules)


# ---- CONNECT storm (a worker process on the load CPUs) ---------------------------------------
@dataclass(frozen=True, slots=True)
class Storm:
    port: int
    broker_pid: int
    connects: int
    parallel: int
    warmup: int
    users: list[tuple[str, str]]
    login: Callable[[str, tuple[str, str]], Login] = PasswordLogin


def _storm_worker(storm: Storm, cpus: set[int], results: Any) -> None:
    try:
        os.sched_setaffinity(0, cpus)
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        _run_connects(storm, storm.warmup)  # unmeasured: the broker's first connections
        cpu0, t0 = procstat.cpu_seconds(storm.broker_pid), time.monotonic()
        ok, failed, latencies = _run_connects(storm, storm.connects)
        elapsed = time.monotonic() - t0
        cpu = procstat.cpu_seconds(storm.broker_pid) - cpu0
        results.send(("ok", ok, failed, elapsed, cpu, latencies))
    except BaseException as exc:  # reported by the orchestrator
        results.send(("error", f"{type(exc).__name__}: {exc}"))


class _Slot:
    __slots__ = ("login", "sock", "started", "state")

    def __init__(self, login: Login) -> None:
        self.login = login
        self.sock: socket.socket | None = None
        self.state = 0  # 0 connecting, 1 logging in, 2 waiting for the close
        self.started = 0.0


def _run_connects(storm: Storm, total: int) -> tuple[int, int, list[float]]:
    """`total` CONNECT/CONNACK/DISCONNECT exchanges, `parallel` at a time, non-blocking
    sockets on epoll. Returns (accepted, refused or failed, CONNACK latencies)."""
    sel = selectors.DefaultSelector()
    slots = [_Slot(storm.login(f"sec-{n}", storm.users[n % len(storm.users)]))
             for n in range(min(storm.parallel, total))]
    started = ok = failed = 0
    latencies: list[float] = []
    deadline = time.monotonic() + STORM_TIMEOUT

    def begin(slot: _Slot) -> None:
        nonlocal started
        started += 1
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        slot.sock, slot.state = sock, 0
        slot.started = time.perf_counter()
        code = sock.connect_ex(("127.0.0.1", storm.port))
        if code not in (0, errno.EINPROGRESS):
            raise OSError(code, os.strerror(code))
        sel.register(sock, selectors.EVENT_WRITE, slot)

    def finish(slot: _Slot, accepted: bool) -> None:
        nonlocal ok, failed
        assert slot.sock is not None
        sel.unregister(slot.sock)
        slot.sock.close()
        slot.sock = None
        if accepted:
            ok += 1
        else:
            failed += 1
        if started < total:
            begin(slot)

    for slot in slots:
        begin(slot)
    try:
        while ok + failed < total:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ok + failed} of {total} connections in {STORM_TIMEOUT} s")
            for key, _ in sel.select(1.0):
                slot = key.data
                sock = slot.sock
                if slot.state == 0:
                    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        finish(slot, False)
                        continue
                    sock.send(slot.login.connect())  # a few dozen bytes: one send
                    slot.state = 1
                    sel.modify(sock, selectors.EVENT_READ, slot)
                    continue
                try:
                    data = sock.recv(256)
                except ConnectionError:
                    finish(slot, slot.state == 2)
                    continue
                if slot.state == 1:
                    answer, accepted = slot.login.feed(data) if data else (b"", False)
                    if answer:
                        sock.send(answer)
                    if accepted is False:
                        finish(slot, False)
                    elif accepted:
                        latencies.append(time.perf_counter() - slot.started)
                        sock.send(DISCONNECT)
                        slot.state = 2
                elif not data:  # the broker closed after DISCONNECT
                    finish(slot, True)
    finally:
        for slot in slots:
            if slot.sock is not None:
                slot.sock.close()
        sel.close()
    return ok, failed, latencies


def connect_round(name: str, launcher: Callable[[Path], brokers.Launch], connects: int,
                  parallel: int, users: list[tuple[str, str]],
                  login: Callable[[str, tuple[str, str]], Login] = PasswordLogin) -> Outcome:
    try:
        with brokers.running(name, launcher=launcher) as broker:
            brokers.wait_started(broker)  # the CONNECT rate of a broker, not of its start-up
            storm = Storm(broker.port, broker.pid, connects, parallel,
                          max(parallel, connects // 10), users, login)
            ctx = multiprocessing.get_context("fork")
            # Read before the worker is joined: a reply larger than the pipe's buffer (the
            # latencies of 10,000 CONNECTs) blocks the worker until it is read.
            results, sender = ctx.Pipe(duplex=False)
            worker = ctx.Process(target=_storm_worker, args=(storm, brokers.load_cpus(), sender),
                                 daemon=True)
            worker.start()
            sender.close()
            try:
                replied = results.poll(STORM_TIMEOUT * 2 + 30)
                reply = results.recv() if replied else None
            except EOFError:  # the worker died without a word
                reply = None
            finally:
                if worker.is_alive():
                    worker.kill()
                worker.join()
                results.close()
            if reply is None:
                raise RuntimeError(f"connect worker exited with {worker.exitcode}")
            if reply[0] != "ok":
                raise RuntimeError(reply[1])
            if not broker.alive():
                raise RuntimeError(f"{name} exited:\n{broker.log_tail()}")
    except Exception as exc:
        return Outcome("connect_auth", name, False, unit="connections/s",
                       error=f"{type(exc).__name__}: {exc}")
    _, ok, failed, elapsed, cpu, latencies = reply
    latencies.sort()
    details = {
        "connects": connects,
        "parallel": parallel,
        "accepted": ok,
        "refused_or_failed": failed,
        "elapsed_s": elapsed,
        "connack_p50_ms": statistics.median(latencies) * 1000 if latencies else None,
        "connack_p99_ms": latencies[int(len(latencies) * 0.99)] * 1000 if latencies else None,
        "broker_cpu": cpu / elapsed,
        "broker_cpu_ms_per_connect": cpu / max(ok, 1) * 1000,
    }
    return Outcome("connect_auth", name, True, connects / elapsed, "connections/s",
                   verified=failed == 0 and ok == connects, details=details)


# ---- cases ---------------------------------------------------------------------------------
def _median_ratio(pairs: list[tuple[Outcome, Outcome]],
                  value: Callable[[Outcome], float | None] = lambda o: o.value
                  ) -> float | None:
    ratios = []
    for a, b in pairs:
        if a.ok and b.ok and (top := value(a)) is not None and (bottom := value(b)):
            ratios.append(top / bottom)
    return statistics.median(ratios) if ratios else None


def _per_cpu(outcome: Outcome) -> float | None:
    """Messages (connections) per second of the broker's CPU time: what a loaded machine
    disturbs less than the rate (a broker given 70% of a core moves 70% of the messages)."""
    cpu = outcome.details.get("broker_cpu")
    return outcome.value / cpu if outcome.value is not None and cpu else None


def _median(outcomes: list[Outcome]) -> float | None:
    values = [o.value for o in outcomes if o.ok and o.value is not None]
    return statistics.median(values) if values else None


def _cell(outcome: Outcome) -> dict[str, Any]:
    return {"ok": outcome.ok, "value": outcome.value, "verified": outcome.verified,
            "error": outcome.error, **outcome.details}


def jwt_users() -> list[tuple[str, str]]:
    """(user, token) pairs: HS256 tokens with the user as `sub`, valid for a day."""
    import jwt

    expiry = int(time.time()) + 86_400
    return [(f"user{n}", jwt.encode({"sub": f"user{n}", "exp": expiry}, JWT_SECRET, "HS256"))
            for n in range(USERS)]


def make_scram_file(path: Path, users: list[tuple[str, str]]) -> None:
    """The SCRAM users, as `broker ctl users add --scram` writes them (EMQX's 4096
    iterations)."""
    path.write_text(dump_scram_file({user: make_user(user, password.encode(), False,
                                                     DEFAULT_ITERATIONS)
                                     for user, password in users}))


# Each of ours' other methods against ours with the password file and against Mosquitto's.
_OTHERS: Final = ("ours_jwt", "ours_scram", "ours_http")


def run_connect(args: argparse.Namespace, tmp: Path, names: list[str]) -> dict[str, Any]:
    users = [(f"user{n}", f"secret-{n}-pw") for n in range(USERS)]
    passwords, scram = tmp / "passwd", tmp / "scram.json"
    tool = make_password_file(passwords, users)
    make_scram_file(scram, users)
    probe = users[0]
    user_line = f"user {pwd.getpwuid(os.getuid()).pw_name}\n"
    tokens = jwt_users()
    with allow_service(brokers.load_cpus()) as url:
        cases: dict[str, tuple[Callable[[Path], brokers.Launch], list[tuple[str, str]],
                               Callable[[str, tuple[str, str]], Login]]] = {
            "ours": (brokers.ours_with({"authentication.password_file": str(passwords)},
                                       probe), users, PasswordLogin),
            # `user`: started as root Mosquitto drops to user mosquitto, who cannot read our
            # temp dir; it must stay the user that owns it (ignored when not started as root).
            "mosquitto": (brokers.mosquitto_with(
                f"password_file {passwords}\nallow_anonymous false\n{user_line}", probe), users,
                PasswordLogin),
            "ours_jwt": (brokers.ours_with({"authentication.jwt.secret": JWT_SECRET},
                                           tokens[0]), tokens, PasswordLogin),
            # The probe connects without a method: SCRAM alone leaves anonymous clients in.
            "ours_scram": (brokers.ours_with({"authentication.scram.user_file": str(scram)}),
                           users, ScramLogin),
            "ours_http": (brokers.ours_with({"authentication.http.url": url}, probe), users,
                          PasswordLogin),
            # No password file: the same CONNECTs, credentials unchecked (anonymous allowed).
            "ours_open": (brokers.ours_with({}), users, PasswordLogin),
            "mosquitto_open": (brokers.mosquitto_with(user_line), users, PasswordLogin),
        }
        names = [*names, *_OTHERS] if "ours" in names else names
        names += [f"{name}_open" for name in ("ours", "mosquitto") if name in names]
        rounds: dict[str, list[Outcome]] = {name: [] for name in names}
        for n in range(args.rounds):
            for name in names:
                launcher, credentials, login = cases[name]
                outcome = connect_round(name, launcher, args.connects, args.parallel,
                                        credentials, login)
                rounds[name].append(outcome)
                print(f"  round {n + 1} {name:10} {_fmt(outcome, 'connections/s')}", flush=True)
    result: dict[str, Any] = {
        "title": "CONNECT/CONNACK/DISCONNECT per second: a password file and none (ours,"
                 " Mosquitto), JWT, SCRAM-SHA-256 and HTTP authentication (ours)",
        "unit": "connections/s",
        "password_file": f"{USERS} users, $7$ PBKDF2-SHA512 (101 iterations), made by {tool}",
        "scram": f"the same {USERS} users, SCRAM-SHA-256 over MQTT 5 AUTH, 4096 iterations"
                 " (the client keeps each user's salted password)",
        "http": "authentication.http.url: an aiohttp service answering allow, on the load CPUs",
        "results": {name: {"median": _median(outs), "rounds": [_cell(o) for o in outs]}
                    for name, outs in rounds.items()},
    }
    for top, bottom in (("ours", "mosquitto"), ("ours_open", "mosquitto_open"),
                        *((other, base) for other in _OTHERS for base in ("ours", "mosquitto"))):
        if top in rounds and bottom in rounds:
            pairs = list(zip(rounds[top], rounds[bottom], strict=True))
            key = f"ratio_{top}_{'password_file' if bottom == 'ours' else bottom}"
            result[key] = _median_ratio(pairs)
            result[key + "_per_broker_cpu"] = _median_ratio(pairs, _per_cpu)
    return result


def run_acl(args: argparse.Namespace, tmp: Path, timing: Timing) -> dict[str, Any]:
    acl = tmp / "acl"
    make_acl_file(acl, args.rules)
    scenario = next(s for s in SCENARIOS if s.key == "b")
    cases = {"acl": brokers.ours_with({"authorization.acl_file": str(acl)}),
             "no_acl": brokers.ours_with({})}
    rounds: dict[str, list[Outcome]] = {case: [] for case in cases}
    for n in range(args.rounds):
        for case, launcher in cases.items():
            try:
                with brokers.running("ours", launcher=launcher) as broker:
                    outcome = throughput(scenario, broker, timing)
            except Exception as exc:
                outcome = Outcome(scenario.name, "ours", False,
                                  error=f"{type(exc).__name__}: {exc}")
            rounds[case].append(outcome)
            print(f"  round {n + 1} {case:10} {_fmt(outcome, 'msgs/s')}", flush=True)
    return {
        "title": f"QoS 1, 1 -> 1 on ours with a {args.rules}-rule ACL file against none",
        "unit": "msgs/s",
        "rules": args.rules,
        "results": {case: {"median": _median(outs), "rounds": [_cell(o) for o in outs]}
                    for case, outs in rounds.items()},
        "ratio_acl_no_acl": _median_ratio(list(zip(rounds["acl"], rounds["no_acl"],
                                                   strict=True))),
        "ratio_acl_no_acl_per_broker_cpu": _median_ratio(
            list(zip(rounds["acl"], rounds["no_acl"], strict=True)), _per_cpu),
        "target": 0.9,
    }


def _fmt(outcome: Outcome, unit: str) -> str:
    if not outcome.ok or outcome.value is None:
        return f"FAILED: {outcome.error}"
    d = outcome.details
    extra = (f"CONNACK p50 {d['connack_p50_ms']:.1f} ms, p99 {d['connack_p99_ms']:.1f} ms, "
             f"broker CPU {d['broker_cpu']:.0%}, {d['refused_or_failed']} failed"
             if "connack_p50_ms" in d else
             f"broker CPU {d.get('broker_cpu', 0):.0%}, lost {d.get('lost')}, "
             f"dup {d.get('duplicates')}")
    return f"{outcome.value:>10,.0f} {unit}  ({extra})"


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="security-bench-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="connect,acl", help="connect, acl or both")
    parser.add_argument("--connects", type=int, help="measured connections per round")
    parser.add_argument("--parallel", type=int, default=32, help="connections at a time")
    parser.add_argument("--rounds", type=int, help="rounds of each case")
    parser.add_argument("--rules", type=int, default=100, help="rules in the ACL file")
    parser.add_argument("--duration", type=float, help="acl: measured window, seconds")
    parser.add_argument("--warmup", type=float, help="acl: unmeasured ramp-up, seconds")
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    brokers.add_arguments(parser, ALL_BROKERS, RESULTS)
    args = parser.parse_args(argv)
    args.connects = args.connects or (500 if args.quick else 5000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    names = brokers.chosen(args, ALL_BROKERS)
    only = {part.strip() for part in args.only.split(",") if part.strip()}
    timing = Timing(warmup=args.warmup if args.warmup is not None else (0.5 if args.quick else 2.0),
                    duration=args.duration or (1.0 if args.quick else 5.0), idle_connections=0)
    versions = {name: brokers.version(name) for name in names}
    env = report.environment(versions, timing, brokers.load_cpus())
    print(f"brokers: {versions}; "
          + (f"broker on CPU {brokers.BROKER_CPU}, load on CPUs {sorted(brokers.load_cpus())}"
             if brokers.pinned() else "no CPU pinning"))
    out: dict[str, Any] = {"environment": env}
    started = time.monotonic()
    with _scratch() as tmp:
        if "connect" in only:
            print(f"\nconnect) {args.connects} CONNECTs with a password, {args.parallel} at a"
                  f" time, {args.rounds} rounds")
            out["connect_auth"] = run_connect(args, tmp, names)
        if "acl" in only:
            print(f"\nacl) QoS 1, 1 -> 1, ours with a {args.rules}-rule ACL and without,"
                  f" {args.rounds} rounds")
            out["acl_qos1"] = run_acl(args, tmp, timing)
    env["total_runtime_s"] = round(time.monotonic() - started, 1)
    report.write_json(out, args.output)
    print()
    if "connect_auth" in out:
        section = out["connect_auth"]
        for name, cell in section["results"].items():
            print(f"connect_auth {name:10} median {cell['median'] or 0:>10,.0f} connections/s")
        for key, value in section.items():
            if key.startswith("ratio_") and not key.endswith("_per_broker_cpu") and value:
                print(f"connect_auth {key[len('ratio_'):]} {value:.2f}; per broker CPU second"
                      f" {section[key + '_per_broker_cpu']:.2f}")
    if "acl_qos1" in out:
        section = out["acl_qos1"]
        for case, cell in section["results"].items():
            print(f"acl_qos1     {case:10} median {cell['median'] or 0:>10,.0f} msgs/s")
        if section["ratio_acl_no_acl"] is not None:
            print(f"acl_qos1     acl/no_acl {section['ratio_acl_no_acl']:.2f} (target >= 0.9);"
                  f" per broker CPU second {section['ratio_acl_no_acl_per_broker_cpu']:.2f}")
    print(f"\nwrote {args.output} in {env['total_runtime_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
