"""The node's Prometheus metrics: collectors that read `Stats` (broker/stats.py) and the
components' samples when /metrics is fetched. Imported with the HTTP API, not before the
MQTT listeners serve: prometheus_client costs a tenth of a second to import.
"""

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from broker.ds import DurableStorage
from broker.stats import Sample, Stats

Family = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily


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
