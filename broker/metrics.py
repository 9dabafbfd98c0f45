"""Broker statistics: plain integers on the hot path, turned into Prometheus metrics on scrape.

prometheus-client's Counter.inc() costs about a microsecond with labels; at hundreds of
thousands of messages a second that is a visible share of the budget, so the broker bumps
attributes of `Stats` and a custom collector reads them only when /metrics is fetched.
"""

import asyncio
import bisect
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Final

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from broker.ds import DurableStorage

# A histogram's value: cumulative (upper bound, count) buckets ending with "+Inf", and the sum.
Histogram = tuple[list[tuple[str, float]], float]
Family = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily

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


class _StatsCollector(Collector):
    def __init__(self, stats: Stats, gauges: Callable[[], dict[str, tuple[str, float]]]) -> None:
        self._stats = stats
        self._gauges = gauges

    def collect(self) -> Iterator[Family]:
        stats = self._stats
        for name, values, doc in (
            ("mqtt_messages_received", stats.messages_received, "PUBLISH received from clients"),
            ("mqtt_messages_sent", stats.messages_sent, "PUBLISH sent to clients"),
        ):
            family = CounterMetricFamily(name, doc, labels=["qos"])
            for qos, value in enumerate(values):
                family.add_metric([str(qos)], value)
            yield family
        dropped = CounterMetricFamily(
            "mqtt_messages_dropped", "Messages dropped, by reason", labels=["reason"]
        )
        for reason, value in sorted(stats.messages_dropped.items()):
            dropped.add_metric([reason], value)
        yield dropped
        timed_out = CounterMetricFamily(
            "mqtt_connections_timed_out",
            "Connections closed for being too slow: a WebSocket handshake or HTTP request"
            " headers, or an MQTT packet once begun, that did not arrive in time",
            labels=["stage"],
        )
        for stage, value in sorted(stats.timed_out.items()):
            timed_out.add_metric([stage], value)
        yield timed_out
        refused = CounterMetricFamily(
            "mqtt_limit_refusals", "Requests refused by a configured limit, by limit",
            labels=["limit"])
        for limit, value in sorted(stats.refused.items()):
            refused.add_metric([limit], value)
        yield refused
        throttled = CounterMetricFamily(
            "mqtt_limit_throttled",
            "Times a client was not read for a while for sending above a rate limit, by limit",
            labels=["limit"])
        for limit, value in sorted(stats.throttled.items()):
            throttled.add_metric([limit], value)
        yield throttled
        yield CounterMetricFamily("mqtt_bytes_received", "Bytes read", value=stats.bytes_received)
        yield CounterMetricFamily("mqtt_bytes_sent", "Bytes written", value=stats.bytes_sent)
        yield CounterMetricFamily(
            "mqtt_connections_accepted", "Connections accepted", value=stats.connections_total
        )
        yield CounterMetricFamily(
            "mqtt_packets_malformed", "Connections closed for a malformed packet",
            value=stats.packets_malformed,
        )
        yield CounterMetricFamily(
            "mqtt_durable_messages_persisted", "Messages stored once for durable sessions",
            value=stats.durable_persisted,
        )
        yield CounterMetricFamily(
            "mqtt_durable_messages_replayed",
            "Unacknowledged deliveries resent when a durable session resumed",
            value=stats.durable_replayed,
        )
        yield CounterMetricFamily(
            "mqtt_durable_session_tombstones_swept",
            "Ended durable sessions' epochs this node, leading the replicated `sessions`"
            " group, had the replicas forget (older than durable_sessions.tombstone_ttl)",
            value=stats.tombstones_swept,
        )
        yield CounterMetricFamily(
            "mqtt_shared_group_redelivered",
            "QoS 1 deliveries of a durable shared group delivered by another member than the"
            " one they were read for: left unacknowledged when its session ended, or never sent"
            " when its client left (MQTT 5.0 section 4.8.2)",
            value=stats.shared_adopted)
        writes = stats.durable_writes
        histogram = HistogramMetricFamily(
            "mqtt_durable_write_seconds",
            "Time from messages being handed to Durable Storage until they are durable (what"
            " a QoS 1/2 PUBACK waits for), per batch of one event-loop turn")
        buckets, seconds = writes.histogram()
        histogram.add_metric([], buckets=buckets, sum_value=seconds)
        yield histogram
        yield CounterMetricFamily(
            "mqtt_durable_write_errors",
            "Batches of messages Durable Storage failed to store: their publishers get no"
            " PUBACK and are disconnected", value=writes.failed)
        for name, (doc, gauge) in self._gauges().items():
            yield GaugeMetricFamily(name, doc, value=gauge)


# (name, "counter" | "gauge" | "histogram", help, labels, value): what a component reports
# without importing prometheus_client. A value of None declares the family, with no sample.
Sample = tuple[str, str, str, dict[str, str], float | Histogram | None]


class _SamplesCollector(Collector):
    """Families built from a component's labelled samples (one family per name)."""

    def __init__(self, samples: Callable[[], Iterable[Sample]]) -> None:
        self._samples = samples

    def collect(self) -> Iterator[Family]:
        families: dict[str, Family] = {}
        for name, kind, doc, labels, value in self._samples():
            family = families.get(name)
            if family is None:
                kind_class = {"counter": CounterMetricFamily,
                              "histogram": HistogramMetricFamily}.get(kind, GaugeMetricFamily)
                family = families[name] = kind_class(name, doc, labels=list(labels))
            if value is None:
                continue
            if isinstance(family, HistogramMetricFamily):
                assert isinstance(value, tuple)
                family.add_metric(list(labels.values()), buckets=value[0], sum_value=value[1])
            else:
                assert not isinstance(value, tuple)
                family.add_metric(list(labels.values()), value)
        yield from families.values()


class Registry(CollectorRegistry):
    """The node's metrics: collectors, formatted at each scrape, and families a component
    keeps formatted itself (`add_rendered`). prometheus_client formats about 100,000 samples
    a second: a family with a sample per durable group (30,000 with 10,000 groups) would
    hold the event loop for a third of a second at every scrape, so its owner renders it in
    time slices as it rebuilds it, and a scrape only appends the text."""

    def __init__(self) -> None:
        super().__init__()
        self._rendered: list[Callable[[], bytes]] = []

    def add_rendered(self, text: Callable[[], bytes]) -> None:
        """`text` returns whole families in the text format (`family_header`,
        `sample_line`), none of them also a collector's."""
        self._rendered.append(text)

    def exposition(self) -> bytes:
        """What `/metrics` answers."""
        return b"".join([generate_latest(self), *(text() for text in self._rendered)])


def family_header(name: str, kind: str, doc: str) -> str:
    """A family's HELP and TYPE lines, as prometheus_client writes them."""
    doc = doc.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


def sample_line(name: str, labels: dict[str, str], value: float) -> str:
    """One labelled sample, as prometheus_client writes it (labels in name order, values
    escaped)."""
    pairs = ",".join(f'{key}="{_escape(labels[key])}"' for key in sorted(labels))
    return f"{name}{{{pairs}}} {floatToGoString(value)}\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def make_registry(
    stats: Stats, gauges: Callable[[], dict[str, tuple[str, float]]],
    ds: DurableStorage | None = None,
    *samples: Callable[[], Iterable[Sample]],
) -> Registry:
    registry = Registry()
    registry.register(_StatsCollector(stats, gauges))
    if ds is not None:
        registry.register(_SamplesCollector(
            lambda: [(name, kind, doc, {}, value) for name, kind, doc, value in ds.metrics()]))
    for source in samples:
        add_samples(registry, source)
    return registry


def add_samples(registry: CollectorRegistry, source: Callable[[], Iterable[Sample]]) -> None:
    """Adds a component that only some configurations have (the Raft groups)."""
    registry.register(_SamplesCollector(source))
