"""The benchmark scenarios and how one of them is run against one broker.

A throughput scenario: subscribers connect and subscribe, then publishers connect, then all
publish at once (phase GO). After `warmup` seconds the delivered count is sampled, and again
`duration` seconds later: the rate is the difference over the window, so connection set-up and
the ramp-up are never measured. Then publishers stop, wait for their PUBACKs, and the
orchestrator waits for the subscribers to receive everything that was published, to verify
the totals (QoS 1: delivered must equal published; QoS 0: the shortfall is reported as loss).

The idle scenario measures the broker's resident memory before and after opening N connections
that only CONNECT and then stay idle.
"""

import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import brokers, procstat, wire
from bench.loadgen import (
    DONE,
    DRAIN_TIMEOUT,
    GO,
    STOP,
    IdleSpec,
    PublisherSpec,
    Shared,
    Spec,
    SubscriberSpec,
    run_worker,
)

PAYLOAD = bytes(range(100))
"""100-byte payload; its bytes are irrelevant to every broker under test."""


QOS0_MAX_LAG_DELIVERIES = 5_000
"""QoS 0 cap on deliveries (messages x subscribers) published but not yet received (~0.5 MB;
at least 100 messages per subscriber). Enough to keep every broker busy; small enough that no
broker's queues grow without bound. amqtt slows down by orders of magnitude with a deep
backlog (20,000 messages queued took it from thousands of msgs/s to single digits)."""

READY_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Scenario:
    key: str
    name: str
    title: str
    qos: int = 0
    publishers: int = 1
    subscribers: int = 1
    window: int = 0  # QoS 1 unacknowledged PUBLISHes per publisher connection
    max_lag: int = 0  # QoS 1 cap on messages published but not yet delivered (see SCENARIOS)
    pub_procs: int = 1
    sub_procs: int = 1
    idle_procs: int = 0  # > 0 makes this the idle-connections memory scenario
    clean: bool = True  # False: subscribers hold persistent sessions (durable_bench.py)

    @property
    def idle(self) -> bool:
        return self.idle_procs > 0


# QoS 1 lag caps keep Mosquitto, run with its defaults (max_inflight_messages 20,
# max_queued_messages 1000), from dropping: beyond 1000 queued messages per subscriber it
# silently drops QoS 1 messages it has already PUBACKed to the publisher. In fan-in its queue
# count runs far ahead of what the subscriber has received, because it reads one packet per
# connection per loop pass: 100 publishers' PUBLISHes are taken in for each PUBACK from the
# subscriber. 100 undelivered messages is the cap at which no drop was observed.
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("a", "qos0_1to1", "QoS 0, 1 publisher -> 1 subscriber"),
    Scenario("b", "qos1_1to1", "QoS 1, 1 publisher -> 1 subscriber", qos=1, window=500,
             max_lag=800),
    Scenario("c", "qos0_fanout100", "QoS 0 fan-out, 1 publisher -> 100 subscribers",
             subscribers=100, sub_procs=2),
    Scenario("d", "qos1_fanin100", "QoS 1 fan-in, 100 publishers -> 1 subscriber (wildcard)",
             qos=1, publishers=100, window=5, max_lag=100, pub_procs=2),
    Scenario("e", "idle_conns", "RSS of N idle connections", idle_procs=2),
)


@dataclass(frozen=True, slots=True)
class Timing:
    warmup: float
    duration: float
    idle_connections: int


@dataclass(slots=True)
class Outcome:
    """One scenario x broker cell. `ok` = measured; `verified` = counts add up."""

    scenario: str
    broker: str
    ok: bool
    value: float | None = None
    unit: str = "msgs/s"
    verified: bool = False
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def split(items: Sequence[str], parts: int) -> list[list[str]]:
    return [list(items[i::parts]) for i in range(parts) if items[i::parts]]


class Fleet:
    """The generator's worker processes for one run, and their shared counters."""

    def __init__(self, specs: list[Spec]) -> None:
        self.ctx = multiprocessing.get_context("fork")
        self.specs = specs
        self.shared = Shared(len(specs))
        self.errors = self.ctx.SimpleQueue()
        self.procs: dict[int, multiprocessing.process.BaseProcess] = {}
        self.cpus = brokers.load_cpus()

    def start(self, slots: range) -> None:
        for slot in slots:
            proc = self.ctx.Process(
                target=run_worker, daemon=True,
                args=(self.specs[slot], self.shared, slot, self.cpus, self.errors),
            )
            proc.start()
            self.procs[slot] = proc

    def check(self) -> None:
        """Raise the first worker error, or if a worker died without saying why."""
        if not self.errors.empty():
            slot, text = self.errors.get()
            raise RuntimeError(f"load worker {slot} failed: {text}")
        for slot, proc in self.procs.items():
            if proc.exitcode not in (None, 0):
                raise RuntimeError(f"load worker {slot} died with exit code {proc.exitcode}")

    def wait_ready(self, slots: range, broker: brokers.Running, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(self.shared.ready[s] == 1 for s in slots):
            self.check()
            check_broker(broker)
            if time.monotonic() > deadline:
                raise TimeoutError(f"load workers not connected after {timeout:.0f}s")
            time.sleep(0.02)

    def cpu(self) -> float:
        return sum(procstat.cpu_seconds(p.pid) for p in self.procs.values() if p.pid)

    def close(self) -> None:
        self.shared.phase.value = DONE
        for proc in self.procs.values():
            proc.join(10)
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()


def check_broker(broker: brokers.Running) -> None:
    if not broker.alive():
        raise RuntimeError(
            f"{broker.name} exited with {broker.proc.returncode}:\n{broker.log_tail()}"
        )


def _sleep_watching(seconds: float, fleet: Fleet, broker: brokers.Running) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(0.1, left))
        fleet.check()
        check_broker(broker)


def wait_until(done: Callable[[], bool], progress: Callable[[], int], quiet: float,
               limit: float, watch: Callable[[], None] | None = None) -> None:
    """Poll until `done()`, or `progress()` has not moved for `quiet` s, or `limit` s passed.
    `watch` runs on every poll, to raise as soon as a worker or the broker died."""
    end = time.monotonic() + limit
    last, since = progress(), time.monotonic()
    while not done() and time.monotonic() < end:
        time.sleep(0.02)
        if watch is not None:
            watch()
        now_value = progress()
        if now_value != last:
            last, since = now_value, time.monotonic()
        elif time.monotonic() - since > quiet:
            return


def throughput(sc: Scenario, broker: brokers.Running, timing: Timing) -> Outcome:
    topics = [f"bench/{sc.name}/{i:03d}" for i in range(sc.publishers)]
    topic_filter = f"bench/{sc.name}/+" if sc.publishers > 1 else topics[0]
    layout = wire.publish_layout(topics[0], PAYLOAD, sc.qos)
    max_lag = sc.max_lag if sc.qos else max(100, QOS0_MAX_LAG_DELIVERIES // sc.subscribers)
    run_id = f"{broker.name}-{sc.key}"
    subs = split([f"bench-{run_id}-sub{i}" for i in range(sc.subscribers)], sc.sub_procs)
    pub_ids = [f"bench-{run_id}-pub{i}" for i in range(sc.publishers)]
    pubs = split(pub_ids, sc.pub_procs)
    by_id = dict(zip(pub_ids, topics, strict=True))
    specs: list[Spec] = [
        SubscriberSpec(broker.port, ids, topic_filter, sc.qos, layout, clean=sc.clean)
        for ids in subs
    ]
    specs += [
        PublisherSpec(broker.port, ids, [by_id[i] for i in ids], PAYLOAD, sc.qos,
                      subscribers=sc.subscribers, max_lag=max_lag, peers=len(pubs),
                      window=sc.window,
                      chunk=min(500, max(1, max_lag // 4)))
        for ids in pubs
    ]
    sub_slots, pub_slots = range(len(subs)), range(len(subs), len(specs))
    fleet = Fleet(specs)
    sh = fleet.shared
    try:
        fleet.start(sub_slots)
        fleet.wait_ready(sub_slots, broker, READY_TIMEOUT)
        fleet.start(pub_slots)
        fleet.wait_ready(pub_slots, broker, READY_TIMEOUT)
        sh.phase.value = GO
        _sleep_watching(timing.warmup, fleet, broker)
        t0, d0, s0 = time.monotonic(), sum(sh.delivered), sum(sh.sent)
        b0, g0, m0 = procstat.cpu_seconds(broker.pid), fleet.cpu(), procstat.machine_busy_seconds()
        _sleep_watching(timing.duration, fleet, broker)
        t1, d1, s1 = time.monotonic(), sum(sh.delivered), sum(sh.sent)
        b1, g1, m1 = procstat.cpu_seconds(broker.pid), fleet.cpu(), procstat.machine_busy_seconds()
        sh.phase.value = STOP
        wait_until(lambda: all(sh.finished[s] for s in pub_slots), lambda: sum(sh.acked),
                    quiet=DRAIN_TIMEOUT, limit=DRAIN_TIMEOUT + 5)
        fleet.check()
        published = sum(sh.acked) if sc.qos else sum(sh.sent)
        unacked = sum(sh.sent) - sum(sh.acked) if sc.qos else 0
        expected = published * sc.subscribers
        wait_until(lambda: sum(sh.delivered) >= expected, lambda: sum(sh.delivered),
                    quiet=3.0 if sc.qos else 1.0, limit=20.0)
        delivered = sum(sh.delivered)
        fleet.check()
    finally:
        fleet.close()
    window = t1 - t0
    lost = expected - delivered
    verified = lost == 0 and unacked == 0
    details = {
        "deliveries_per_s": (d1 - d0) / window,
        "published_per_s": (s1 - s0) / window,
        "window_s": window,
        "published": published,
        "expected_deliveries": expected,
        "delivered": delivered,
        "lost": max(lost, 0),
        "duplicates": max(-lost, 0),
        "unacked_by_broker": unacked,
        "broker_cpu": (b1 - b0) / window,
        "generator_cpu": (g1 - g0) / window,
        "other_cpu": max(0.0, (m1 - m0) - (b1 - b0) - (g1 - g0)) / window,
        "slow_path": bool(any(sh.slow_path)),
        "publishers": sc.publishers,
        "subscribers": sc.subscribers,
        "qos": sc.qos,
    }
    return Outcome(sc.name, broker.name, True, (d1 - d0) / window, "msgs/s", verified,
                   details=details)


def idle_connections(sc: Scenario, broker: brokers.Running, timing: Timing) -> Outcome:
    n = timing.idle_connections
    time.sleep(0.5)  # let start-up allocations settle before the baseline
    before = procstat.rss_kib(broker.pid)
    ids = [f"bench-{broker.name}-idle{i}" for i in range(n)]
    specs: list[Spec] = [IdleSpec(broker.port, part) for part in split(ids, sc.idle_procs)]
    slots = range(len(specs))
    fleet = Fleet(specs)
    try:
        started = time.monotonic()
        fleet.start(slots)
        fleet.wait_ready(slots, broker, timeout=max(READY_TIMEOUT, n / 50))
        connect_s = time.monotonic() - started
        after = settled_rss(broker.pid)
        check_broker(broker)
    finally:
        fleet.close()
    connected, dropped = sum(fleet.shared.connected), sum(fleet.shared.dropped)
    delta_kib = after - before
    details = {
        "connections": n,
        "connected": connected,
        "dropped_by_broker": dropped,
        "rss_before_mib": before / 1024,
        "rss_after_mib": after / 1024,
        "kib_per_connection": delta_kib / max(connected, 1),
        "connects_per_s": connected / connect_s,
    }
    verified = connected == n and dropped == 0
    return Outcome(sc.name, broker.name, True, delta_kib / 1024, "MiB", verified,
                   details=details)


def settled_rss(pid: int) -> int:
    """VmRSS once it stops moving (within 1% over 0.5 s), at most 5 s after the last connect."""
    deadline = time.monotonic() + 5
    last = procstat.rss_kib(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = procstat.rss_kib(pid)
        if abs(now - last) <= last * 0.01:
            return now
        last = now
    return last


def run(sc: Scenario, broker_name: str, timing: Timing) -> Outcome:
    """Start a fresh broker, run one scenario on it, stop it; never raises."""
    try:
        with brokers.running(broker_name) as broker:
            if sc.idle:
                return idle_connections(sc, broker, timing)
            return throughput(sc, broker, timing)
    except Exception as exc:
        unit = "MiB" if sc.idle else "msgs/s"
        return Outcome(sc.name, broker_name, False, unit=unit,
                       error=f"{type(exc).__name__}: {exc}")
