"""Broker statistics: plain integers on the hot path, turned into Prometheus metrics on scrape
(broker/metrics.py).

prometheus-client's Counter.inc() costs about a microsecond with labels; at hundreds of
thousands of messages a second that is a visible share of the budget, so the broker bumps
attributes of `Stats` and a custom collector reads them only when /metrics is fetched. Apart
from the metrics module: prometheus_client is imported with the HTTP API, after the MQTT
listeners serve (start-up, tests/unit/test_startup_imports.py).
"""

import asyncio
import bisect
import itertools
import time
from typing import Final

# A histogram's value: cumulative (upper bound, count) buckets ending with "+Inf", and the sum.
Histogram = tuple[list[tuple[str, float]], float]

# Upper bounds of mqtt_durable_write_seconds: a local fsync takes milliseconds, a Raft
# commit one round trip more, and a write past seconds holds its publishers' PUBACKs.
WRITE_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0, 10.0)


class DurableWrites:
    """How long messages handed to Durable Storage wait until they are durable, and how many
    batches failed: what publishers of QoS 1/2 wait on before their PUBACK. Timed per batch
    (every message of one event-loop turn shares one future), so the hot path pays one
    identity check per message and one callback per batch."""

    __slots__ = ("_last", "counts", "failed", "seconds")

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None
        self.counts = [0] * (len(WRITE_BUCKETS) + 1)  # per bound, then beyond the last
        self.seconds = 0.0
        self.failed = 0

    def watch(self, stored: asyncio.Future[None]) -> None:
        if stored is self._last:
            return
        self._last = stored
        started = time.perf_counter()
        stored.add_done_callback(lambda done: self._done(done, started))

    def _done(self, stored: asyncio.Future[None], started: float) -> None:
        if stored.cancelled():
            return  # the broker stops: nothing was refused
        if stored.exception() is not None:
            self.failed += 1
            return
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        self.counts[bisect.bisect_left(WRITE_BUCKETS, elapsed)] += 1

    def histogram(self) -> Histogram:
        bounds = [*map(str, WRITE_BUCKETS), "+Inf"]
        return list(zip(bounds, map(float, itertools.accumulate(self.counts)),
                        strict=True)), self.seconds


class Stats:
    __slots__ = (
        "bytes_received", "bytes_sent", "connections_total", "durable_persisted",
        "durable_replayed", "durable_writes", "messages_dropped", "messages_received",
        "messages_sent", "packets_malformed", "refused", "shared_adopted", "throttled",
        "timed_out", "tombstones_swept",
    )

    def __init__(self) -> None:
        self.messages_received = [0, 0, 0]
        self.messages_sent = [0, 0, 0]
        self.messages_dropped: dict[str, int] = {}
        self.bytes_received = 0
        self.bytes_sent = 0
        self.connections_total = 0
        self.packets_malformed = 0
        self.durable_persisted = 0  # messages stored for durable sessions
        self.durable_replayed = 0  # unacknowledged deliveries resent after a resume
        self.tombstones_swept = 0  # ended sessions' epochs forgotten (sessions leader)
        self.shared_adopted = 0  # deliveries a durable group member took from an ended one
        self.durable_writes = DurableWrites()
        self.timed_out: dict[str, int] = {}  # connections closed for slowness, by stage
        self.refused: dict[str, int] = {}  # requests refused by a limit, by limit
        self.throttled: dict[str, int] = {}  # reads paused by a rate limit, by limit

    def drop(self, reason: str, count: int = 1) -> None:
        self.messages_dropped[reason] = self.messages_dropped.get(reason, 0) + count

    def time_out(self, stage: str) -> None:
        self.timed_out[stage] = self.timed_out.get(stage, 0) + 1

    def refuse(self, limit: str) -> None:
        self.refused[limit] = self.refused.get(limit, 0) + 1

    def throttle(self, limit: str) -> None:
        self.throttled[limit] = self.throttled.get(limit, 0) + 1


# (name, "counter" | "gauge" | "histogram", help, labels, value): what a component reports
# without importing prometheus_client. A value of None declares the family, with no sample.
Sample = tuple[str, str, str, dict[str, str], float | Histogram | None]


def family_header(name: str, kind: str, doc: str) -> str:
    """A family's HELP and TYPE lines, as prometheus_client writes them."""
    doc = doc.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"
