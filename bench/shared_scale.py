"""Durable shared subscriptions at scale: does a group of 10,000 members, or 10,000 groups,
keep other clients' latency under 50 ms?

    .venv/bin/python bench/shared_scale.py [--quick] [--members N] [--connected N]
        [--messages N] [--rate R] [--churn-rate R] [--jobs N] [--scenarios a,b,c] [--no-pin]
        [--watch-loop]

One node of ours (builtin_local, fresh temp data dir) per scenario, each holding `--members`
durable sessions (MQTT 5, Clean Start 0, Session Expiry 3600 s) made over `--parallel`
connections at once by a raw asyncio client (CONNECT, SUBSCRIBE QoS 1, DISCONNECT):
  baseline:    the sessions subscribe to nothing: no group;
  one_group:   every session is a member of `$share/big/jobs/#`;
  many_groups: session i is the one member of `$share/g{i}/jobs/{i}`.
Then, on that broker, four measured windows in turn:
  offline:          every member offline (the common case);
  offline_churn:    members connect, stay `--churn-hold` s and leave, `--churn-rate` a second
                    (each connect and leave makes the broker spread the group's shards again);
  connected:        `--connected` members stay connected;
  connected_churn:  both.
In every window a probe (its own process: a plain clean-session subscriber of `probe/x`,
QoS 1, and a QoS 1 publisher) sends `--messages` messages at `--rate` a second on a fixed
schedule and times each from its write to its delivery; `--jobs` QoS 1 messages go to
`jobs/<i>` (the groups' topics) spread over the window; `GET /metrics` and
`GET /api/v5/durable_shared_groups` are timed about once a second; the broker's RSS is read
at the end. `--watch-loop` runs the broker under bench/loopwatch.py, which names the code
behind each long pass of its event loop. See bench/README.md, "Shared subscriptions at
scale". Writes bench/shared_scale_results.json.
"""

import argparse
import dataclasses
import json
import multiprocessing
import os
import random
import selectors
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.parser import text_string_to_metric_families

from bench import brokers, loopwatch, procstat, report, wire
from bench.brokers import Running
from bench.scenarios import PAYLOAD, check_broker, settled_rss
from bench.shared_scale_load import (
    JOB_PUBLISHERS,
    RECV,
    TIMEOUT,
    Load,
    figures,
    own_cpus,
)
from broker.mqtt import packets as mqtt

RESULTS = Path(__file__).resolve().parent / "shared_scale_results.json"
TARGET_MS = 50.0
"""The issue's bound on other clients' latency (p99 of the probe)."""
PROBE_TOPIC = "probe/x"
DRAIN = 10.0
"""Seconds the probe waits for the last deliveries after its last write."""
HTTP_TIMEOUT = 300.0
SCRAPE_INTERVAL = 1.0
QUIET_CPU = 0.2
"""Broker CPU (cores, over a second) under which a scenario counts as settled."""
SPIKES = 5
STALLS = "loop_stalls.jsonl"
"""Where bench/loopwatch.py writes the broker's event-loop stalls (--watch-loop)."""


class Scenario(NamedTuple):
    key: str
    title: str
    filter: str | None  # member i's subscription, `{i}` filled in; None: none


SCENARIOS = (
    Scenario("baseline", "no groups: the same sessions, subscribed to nothing", None),
    Scenario("one_group", "one group $share/big/jobs/#, N members", "$share/big/jobs/#"),
    Scenario("many_groups", "N groups $share/g{i}/jobs/{i}, one member each",
             "$share/g{i}/jobs/{i}"),
)


class Variant(NamedTuple):
    key: str
    connected: bool
    churn: bool


VARIANTS = (Variant("offline", False, False), Variant("offline_churn", False, True),
            Variant("connected", True, False), Variant("connected_churn", True, True))


@dataclass(frozen=True, slots=True)
class Sizes:
    members: int
    connected: int
    parallel: int
    messages: int
    rate: float
    churn_rate: float
    churn_hold: float
    jobs: int
    settle: float

    @property
    def window_s(self) -> float:
        return self.messages / self.rate


def _probe_socket(port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(wire.connect(client_id))
    wire.recv_exact(sock, wire.CONNACK_SIZE)
    return sock


def _probe(port: int, label: str, count: int, rate: float, ready: Any, go: Any, out: Any,
           cpus: set[int]) -> None:
    """The probe process: a clean-session QoS 1 subscriber of PROBE_TOPIC and a QoS 1
    publisher; the publisher writes `count` messages on a fixed schedule (`rate` a second,
    however late the broker is: a stall shows in every message it delays), each numbered
    (wire.IDENTITY); the subscriber notes when each arrives. Sends (sent, delivered) times
    (monotonic, one clock for every process) and the PUBACK times to `out`."""
    try:
        own_cpus(cpus)
        sub = _probe_socket(port, f"scale-probe-sub-{label}")
        sub.sendall(wire.subscribe(PROBE_TOPIC, 1))
        if getattr(wire.decode_one(wire.recv_exact(sub, wire.SUBACK_SIZE)),
                   "reason_codes", None) != [1]:
            raise ConnectionError("probe subscription refused")
        pub = _probe_socket(port, f"scale-probe-pub-{label}")
        inbox = wire.Scanner(wire.publish_layout(PROBE_TOPIC, PAYLOAD, 1), ack=True, record=True)
        acks = wire.Scanner(wire.puback_layout(), ack=False, kind=mqtt.Puback)
        sel = selectors.DefaultSelector()
        sel.register(sub, selectors.EVENT_READ, inbox)
        sel.register(pub, selectors.EVENT_READ, acks)
        sent: list[float] = []
        arrived: list[float] = []  # per PUBLISH received, in order
        acked: list[float] = []  # per PUBACK, in order (a connection's come in order)
        ready.set()
        go.wait()
        start = time.monotonic()
        while inbox.count < count:
            now = time.monotonic()
            if len(sent) < count and now >= start + len(sent) / rate:
                payload = wire.IDENTITY.pack(0, len(sent)) + PAYLOAD[wire.IDENTITY.size:]
                sent.append(time.monotonic())
                pub.sendall(wire.publish(PROBE_TOPIC, payload, 1, len(sent) % 0xFFFF + 1))
                continue
            if len(sent) == count and now > sent[-1] + DRAIN:
                break
            wait = start + len(sent) / rate - now if len(sent) < count else 0.05
            for key, _ in sel.select(max(0.0, wait)):
                data = key.fileobj.recv(RECV)  # type: ignore[union-attr]
                if not data:
                    raise ConnectionError("broker closed a probe connection")
                scanner, before = key.data, key.data.count
                reply = scanner.feed(data)
                (arrived if scanner is inbox else acked).extend(
                    [time.monotonic()] * (scanner.count - before))
                if reply:
                    sub.sendall(reply)
        numbers = [seq for _, seq in wire.IDENTITY.iter_unpack(bytes(inbox.identities or b""))]
        out.put({"sent": sent, "delivered": list(zip(numbers, arrived, strict=True)),
                 "acked": acked})
        for sock in (sub, pub):
            sock.sendall(wire.DISCONNECT)
            sock.close()
    except BaseException:
        out.put({"error": traceback.format_exc(limit=6)})


def probe_figures(result: dict[str, Any], busy: list[tuple[str, float, float]]
                  ) -> dict[str, Any]:
    """The probe's latencies (publish -> deliver, first delivery of each message), PUBACK
    times, losses, and its worst messages, each with what HTTP request (`busy`: name,
    start, end) was in flight when it was sent."""
    sent: list[float] = result["sent"]
    first: dict[int, float] = {}
    for number, at in result["delivered"]:
        first.setdefault(number, at)
    latency = {n: (at - sent[n]) * 1000 for n, at in first.items()}
    pubacks = [(at - s) * 1000 for s, at in zip(sent, result["acked"], strict=False)]
    worst = sorted(latency.items(), key=lambda item: -item[1])[:SPIKES]
    spikes = [{"at_s": round(sent[n] - sent[0], 3), "ms": round(ms, 1),
               "during": [name for name, began, ended in busy if began <= sent[n] <= ended]}
              for n, ms in worst]
    return {"probe_sent": len(sent), "probe_delivered": len(first),
            "probe_undelivered": len(sent) - len(first),
            "probe_duplicates": len(result["delivered"]) - len(first),
            **figures(list(latency.values()), "probe"), **figures(pubacks, "probe_puback"),
            "probe_over_target": sum(ms > TARGET_MS for ms in latency.values()),
            "probe_worst": spikes}


# ---- HTTP: what the dashboard and Prometheus see -----------------------------------------

SCRAPED = (("metrics", "/metrics"), ("api", "/api/v5/durable_shared_groups"))


class Scrapes(threading.Thread):
    """GET /metrics, then the groups' API, again every SCRAPE_INTERVAL s until `finish`:
    each request's start, duration and size; the last bodies."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.samples: dict[str, list[tuple[float, float, int]]] = {n: [] for n, _ in SCRAPED}
        self.bodies: dict[str, bytes] = {}
        self.errors: list[str] = []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            round_began = time.monotonic()
            for name, path in SCRAPED:
                began = time.monotonic()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}",
                                                timeout=HTTP_TIMEOUT) as response:
                        body = response.read()
                except (OSError, ValueError) as exc:
                    self.errors.append(f"{path}: {type(exc).__name__}: {exc}")
                    continue
                self.samples[name].append((began, time.monotonic() - began, len(body)))
                self.bodies[name] = body
            self._done.wait(SCRAPE_INTERVAL - (time.monotonic() - round_began))

    def finish(self) -> None:
        """Stop after the request in flight (which may be slow: it is measured too)."""
        self._done.set()
        self.join(HTTP_TIMEOUT + 10)

    def busy(self) -> list[tuple[str, float, float]]:
        return [(name, began, began + took) for name, samples in self.samples.items()
                for began, took, _ in samples]

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"http_errors": self.errors[:3]}
        for name, samples in self.samples.items():
            out[f"{name}_requests"] = len(samples)
            out.update(figures([took * 1000 for _, took, _ in samples], name))
            out[f"{name}_bytes"] = samples[-1][2] if samples else None
        out.update(_seen(self.bodies))
        return out


def _seen(bodies: dict[str, bytes]) -> dict[str, Any]:
    """Groups and members as the last API answer and the last scrape report them."""
    seen: dict[str, Any] = {}
    if "api" in bodies:
        groups = json.loads(bodies["api"])["data"]
        seen["api_groups"] = len(groups)
        seen["api_members"] = sum(len(g["members"]) for g in groups)
        seen["api_connected"] = sum(m["connected"] for g in groups for m in g["members"])
    if "metrics" in bodies:
        states: dict[str, float] = {}
        for family in text_string_to_metric_families(bodies["metrics"].decode()):
            for sample in family.samples:
                if sample.name == "mqtt_shared_group_members" and sample.labels.get("group"):
                    state = sample.labels["state"]
                    states[state] = states.get(state, 0) + sample.value
        seen["metrics_members"] = {state: int(n) for state, n in sorted(states.items())}
    return seen


# ---- the orchestrator --------------------------------------------------------------------

def _cpu_now(broker: int, generator: Iterable[int]) -> tuple[float, float, float, float]:
    """(monotonic, the broker's CPU seconds, the generator processes', busy seconds of the
    whole machine)."""
    return (time.monotonic(), procstat.cpu_seconds(broker),
            sum(procstat.cpu_seconds(pid) for pid in generator), procstat.machine_busy_seconds())


def _cores(before: tuple[float, ...], after: tuple[float, ...]) -> dict[str, float]:
    """CPU between two `_cpu_now`s, in cores; `other_cpu` the machine's busy time that
    neither the broker nor the generator used (other jobs on this shared machine)."""
    seconds, broker, generator, busy = (b - a for a, b in zip(before, after, strict=True))
    return {"window_s": round(seconds, 1), "broker_cpu": round(broker / seconds, 2),
            "generator_cpu": round(generator / seconds, 2),
            "other_cpu": round(max(0.0, busy - broker - generator) / seconds, 2)}


def settle(broker: Running, limit: float) -> float:
    """Waits (at most `limit` s) until the broker uses less than QUIET_CPU over a second:
    what the last step set off (groups spread again, sessions written) is done. Returns
    the seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < limit:
        before = procstat.cpu_seconds(broker.pid)
        time.sleep(1.0)
        check_broker(broker)
        if procstat.cpu_seconds(broker.pid) - before < QUIET_CPU:
            break
    return round(time.monotonic() - began, 1)


def launcher(watch: bool, profile: Path | None = None) -> Callable[[Path], brokers.Launch]:
    """Ours with its defaults; with `watch`, run under bench/loopwatch.py; with `profile`,
    under cProfile, which writes that file when the broker stops."""
    plain = brokers.ours_with({})
    if not watch and profile is None:
        return plain

    def launch(tmp: Path) -> brokers.Launch:
        ours = plain(tmp)
        profiled = [] if profile is None else ["-m", "cProfile", "-o", str(profile)]
        broker = [loopwatch.__file__, str(tmp / STALLS)] if watch else ["-m", "broker"]
        return dataclasses.replace(ours, argv=[
            str(brokers.OURS_BIN.with_name("python")), *profiled, *broker, *ours.argv[1:]])

    return launch


def stalls(broker: Running, began: float, ended: float) -> dict[str, Any]:
    """The loop's stalls in a window, as bench/loopwatch.py saw them (--watch-loop)."""
    if not (broker.tmp / STALLS).exists():
        return {}
    found = loopwatch.read(broker.tmp / STALLS, began, ended)
    passes = [s for s in found if not s["gap"]]
    sites: dict[str, list[float]] = {}
    for stall in passes:
        if stall["ms"] >= TARGET_MS:
            tally = sites.setdefault(loopwatch.site(stall), [0, 0.0])
            tally[0] += 1
            tally[1] = round(tally[1] + stall["ms"], 1)
    return {"loop_stalls": sum(s["ms"] >= TARGET_MS for s in passes),
            "loop_stall_max_ms": passes[0]["ms"] if passes else 0.0,
            "loop_stall_sites": dict(sorted(sites.items(), key=lambda item: -item[1][1])),
            "loop_worst": passes[:3],
            "process_gaps": sum(s["ms"] >= TARGET_MS for s in found if s["gap"])}


def window(broker: Running, load: Load, variant: Variant, churned: list[str],
           topics: list[str], sizes: Sizes, label: str) -> dict[str, Any]:
    """One measured window: probe, jobs, churn (if the variant's) and scrapes at once."""
    ctx = multiprocessing.get_context("fork")
    ready, go, out = ctx.Event(), ctx.Event(), ctx.SimpleQueue()
    probe = ctx.Process(target=_probe, daemon=True, args=(
        broker.port, label, sizes.messages, sizes.rate, ready, go, out, brokers.load_cpus()))
    probe.start()
    scrapes = Scrapes(broker.http_port)
    try:
        if not ready.wait(TIMEOUT):
            raise TimeoutError("the probe did not connect")
        generator = (load.proc.pid or 0, probe.pid or 0, os.getpid())
        before = _cpu_now(broker.pid, generator)
        load.call("start", churned if variant.churn else [], sizes.churn_rate,
                  sizes.churn_hold, topics, sizes.jobs, sizes.window_s, label)
        scrapes.start()
        go.set()
        limit = time.monotonic() + sizes.window_s + DRAIN + TIMEOUT
        while out.empty():
            check_broker(broker)
            if time.monotonic() > limit or (not probe.is_alive() and out.empty()):
                raise RuntimeError(f"the probe gave no result (exit code {probe.exitcode})")
            time.sleep(0.1)
        result = out.get()
        after = _cpu_now(broker.pid, generator)
        loaded = load.call("stop", limit=2 * TIMEOUT + sizes.churn_hold)
    finally:
        if scrapes.is_alive():
            scrapes.finish()
        probe.join(5)
        if probe.is_alive():
            probe.kill()
    if "error" in result:
        raise RuntimeError(f"probe: {result['error']}")
    cell = {**probe_figures(result, scrapes.busy()), **scrapes.figures(), **loaded,
            **_cores(before, after), **stalls(broker, before[0], after[0]),
            "rss_mib": round(procstat.rss_kib(broker.pid) / 1024, 1)}
    cell["p99_under_target"] = cell.get("probe_p99_ms", float("inf")) < TARGET_MS
    return cell


def broker_build() -> dict[str, Any]:
    """Which `broker` package the broker's process imports (PYTHONPATH may name another
    checkout than this one) and how many of its modules are compiled (0: pure Python)."""
    done = subprocess.run(
        [str(brokers.OURS_BIN.with_name("python")), "-c",
         "import broker.native as n, pathlib; print(pathlib.Path(n.__file__).parent, n.check())"],
        cwd="/", capture_output=True, text=True, timeout=60, check=True)
    package, compiled = done.stdout.split()
    return {"broker_package": package, "native_modules": int(compiled)}


def _log_findings(broker: Running) -> dict[str, Any]:
    """The broker log's warnings and errors: where a stall or a failure was reported."""
    lines = broker.log.read_text(errors="replace").splitlines()
    flagged = [line for line in lines if " WARNING " in line or " ERROR " in line
               or "Traceback" in line]
    return {"log_lines": len(lines), "log_flagged": len(flagged), "log_first": flagged[:8]}


def run_scenario(scenario: Scenario, sizes: Sizes, topics: list[str], watch: bool,
                 profiles: Path | None = None) -> dict[str, Any]:
    """A fresh broker, its sessions, then each variant's window in turn; with `profiles`,
    the broker's cProfile there as SCENARIO.prof."""
    ids = [f"scale-{scenario.key}-{i:05d}" for i in range(sizes.members)]
    subscriptions = {client_id: None if scenario.filter is None else scenario.filter.format(i=i)
                     for i, client_id in enumerate(ids)}
    held, churned = ids[:sizes.connected], ids[sizes.connected:]
    out: dict[str, Any] = {"title": scenario.title.replace("N ", f"{sizes.members:,} "),
                           "windows": {}}
    profile = profiles / f"{scenario.key}.prof" if profiles is not None else None
    with brokers.running("ours", launcher=launcher(watch, profile)) as broker:
        load = Load(broker)
        try:
            out["build"] = load.call("build", subscriptions, sizes.parallel)
            out["build"]["settle_s"] = settle(broker, sizes.settle)
            out["build"]["rss_mib"] = round(settled_rss(broker.pid) / 1024, 1)
            print(f"{scenario.key}: {out['build']['clients']:,} sessions in "
                  f"{out['build']['seconds']}s ({out['build']['failed']} failed), RSS "
                  f"{out['build']['rss_mib']} MiB", flush=True)
            for variant in VARIANTS:
                if variant.connected and "hold" not in out:
                    out["hold"] = load.call("hold", held, sizes.parallel)
                    out["hold"]["settle_s"] = settle(broker, sizes.settle)
                label = f"{scenario.key}-{variant.key}"
                cell = window(broker, load, variant, churned, topics, sizes, label)
                out["windows"][variant.key] = cell
                print(f"  {variant.key:<16} " + " ".join(
                    f"{label} {text}" for (_, label), text in zip(COLUMNS, _row(cell)[1:],
                                                                  strict=False)), flush=True)
            load.call("release")
        finally:
            load.close()
            out.update(_log_findings(broker))
    return out


COLUMNS = (("probe_p50_ms", "p50"), ("probe_p99_ms", "p99"), ("probe_max_ms", "max"),
           ("probe_undelivered", "undelivered"), ("metrics_p50_ms", "/metrics p50"),
           ("metrics_max_ms", "max"), ("api_p50_ms", "API p50"), ("api_max_ms", "max"),
           ("rss_mib", "RSS MiB"), ("broker_cpu", "broker CPU"), ("other_cpu", "other CPU"))


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value >= 100:
        return f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else f"{value:.1f}"


def _row(cell: dict[str, Any]) -> list[str]:
    verdict = "yes" if cell.get("p99_under_target") else "NO"
    return ["", *(_text(cell.get(key)) for key, _ in COLUMNS), verdict]


def _spike(spike: dict[str, Any]) -> str:
    during = f" ({'+'.join(spike['during'])} in flight)" if spike["during"] else ""
    return f"{spike['at_s']}s: {spike['ms']} ms{during}"


def table(results: dict[str, Any]) -> str:
    rows = [["scenario / window (probe ms)", *(label for _, label in COLUMNS),
             f"p99 < {TARGET_MS:.0f} ms"]]
    notes = []
    for key, scenario in results.items():
        if "error" in scenario:
            rows.append([key, "FAILED", *([""] * len(COLUMNS))])
            notes.append(f"{key}: {scenario['error'].splitlines()[-1][:300]}")
            continue
        for variant, cell in scenario["windows"].items():
            rows.append([f"{key} / {variant}", *_row(cell)[1:]])
            if over := [_spike(s) for s in cell["probe_worst"] if s["ms"] > TARGET_MS]:
                notes.append(f"{key} / {variant}: {cell['probe_over_target']} probe messages "
                             f"over {TARGET_MS:.0f} ms; worst at " + ", ".join(over))
            notes += [f"  {n} loop passes >= {TARGET_MS:.0f} ms ({total:,.0f} ms) in {where}"
                      for where, (n, total) in cell.get("loop_stall_sites", {}).items()]
    lines = report.align(rows)
    if notes:
        lines += ["", *notes]
    busy = max((cell.get("other_cpu", 0.0) for scenario in results.values()
                for cell in scenario.get("windows", {}).values()), default=0.0)
    if busy > report.BUSY_MACHINE:
        lines += ["", f"other processes kept up to {busy:.2f} cores busy in a window "
                  "(other_cpu): latencies are noisy"]
    return "\n".join(lines)


QUICK = {"members": 200, "connected": 20, "messages": 100, "jobs": 50, "churn_rate": 50.0,
         "churn_hold": 0.2, "settle": 5.0}
OPTIONS = (
    ("members", int, 10_000, "sessions per scenario: members of the one group, or groups"),
    ("connected", int, 1_000, "members that stay connected in the connected windows"),
    ("parallel", int, 100, "connections at once while making or connecting sessions"),
    ("messages", int, 2_000, "probe messages per window"),
    ("rate", float, 200.0, "probe messages per second"),
    ("churn_rate", float, 200.0, "members connecting (and leaving) per second in churn"),
    ("churn_hold", float, 1.0, "seconds a churned member stays connected"),
    ("jobs", int, 1_000, "QoS 1 messages on jobs/<i> per window"),
    ("settle", float, 60.0, "at most this many seconds waiting for the broker to go quiet"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, kind, default, text in OPTIONS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind,
                            help=f"{text} ({default}; --quick: {QUICK.get(name, default)})")
    parser.add_argument("--scenarios", default=",".join(s.key for s in SCENARIOS),
                        help="comma-separated subset of: " + ",".join(s.key for s in SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--no-pin", action="store_true",
                        help="don't pin the broker to CPU 0 and the generator to CPU 1")
    parser.add_argument("--watch-loop", action="store_true",
                        help="run the broker under bench/loopwatch.py: where its loop stalls")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="run the broker under cProfile: DIR/SCENARIO.prof (pstats)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results JSON path")
    args = parser.parse_args(argv)
    chosen: dict[str, Any] = {
        name: getattr(args, name) if getattr(args, name) is not None else
        (QUICK if args.quick else {}).get(name, default) for name, _, default, _ in OPTIONS}
    sizes = Sizes(**chosen)
    picked = [s for s in SCENARIOS if s.key in args.scenarios.split(",")]
    if not picked or sizes.connected >= sizes.members or sizes.rate <= 0:
        raise SystemExit("pick scenarios from " + ",".join(s.key for s in SCENARIOS)
                         + "; --connected must be below --members; --rate above 0")
    brokers.set_pinning(not args.no_pin)
    if args.profile is not None:  # the broker's working directory is its temp dir
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    topics = [f"jobs/{random.Random(n).randrange(sizes.members)}" for n in range(sizes.jobs)]
    env = {**report.machine(), "broker_version": brokers.version("ours"),
           **broker_build(),
           "pinned": brokers.pinned(), "load_cpus": sorted(brokers.load_cpus()),
           "sizes": {name: getattr(sizes, name) for name, *_ in OPTIONS},
           "target_ms": TARGET_MS, "job_publishers": JOB_PUBLISHERS,
           "loop_watched": args.watch_loop}
    print(f"ours {env['broker_version']} from {env['broker_package']} ("
          f"{env['native_modules'] or 'no'} modules compiled); {sizes.members:,} sessions, "
          f"{sizes.connected:,} connected, probe {sizes.messages} at {sizes.rate:.0f}/s; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    began = time.monotonic()
    results: dict[str, Any] = {}
    for scenario in picked:
        try:
            results[scenario.key] = run_scenario(scenario, sizes, topics, args.watch_loop,
                                                 args.profile)
        except Exception as exc:
            print(f"{scenario.key}: FAILED {exc}", flush=True)
            results[scenario.key] = {"error": f"{type(exc).__name__}: {exc}"}
    cells = [cell for r in results.values() for cell in r.get("windows", {}).values()]
    verdict = {"target_ms": TARGET_MS,
               "p99_under_target": bool(cells) and all(c["p99_under_target"] for c in cells)
               and not any("error" in r for r in results.values()),
               "worst_p99_ms": max((c.get("probe_p99_ms", 0.0) for c in cells), default=None)}
    env["loadavg_at_end"] = os.getloadavg()[0]
    env["total_runtime_s"] = round(time.monotonic() - began, 1)
    report.write_json({"environment": env, "verdict": verdict, "scenarios": results},
                      args.output)
    print("\n" + table(results))
    print(f"\np99 < {TARGET_MS:.0f} ms in every window: "
          f"{'yes' if verdict['p99_under_target'] else 'NO'}; wrote {args.output} in "
          f"{env['total_runtime_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
