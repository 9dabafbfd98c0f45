"""Families a component renders itself (broker.metrics.Registry.add_rendered): written as
prometheus_client writes them, escapes included, and appended whole to a scrape."""

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from broker.metrics import Registry, make_registry, sample_line
from broker.stats import Stats, family_header

DOC = 'Odd help: a back\\slash,\na new line and "quotes"'
LABELS = [{"group": 'g"1', "filter": "a\\b/#"}, {"group": "g\n2", "filter": "+/x"}]


class _Family(Collector):
    def collect(self) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily("mqtt_x", DOC, labels=["group", "filter"])
        for n, labels in enumerate(LABELS):
            family.add_metric([labels["group"], labels["filter"]], n + 0.5)
        return [family]


def test_rendered_text_is_what_prometheus_client_writes() -> None:
    registry = CollectorRegistry()
    registry.register(_Family())
    rendered = family_header("mqtt_x", "gauge", DOC) + "".join(
        sample_line("mqtt_x", labels, n + 0.5) for n, labels in enumerate(LABELS))
    assert rendered.encode() == generate_latest(registry)


def test_a_scrape_appends_the_rendered_families_to_the_collected_ones() -> None:
    registry = make_registry(Stats(), dict)
    assert isinstance(registry, Registry)
    registry.add_rendered(lambda: (family_header("mqtt_x", "gauge", "X") + sample_line(
        "mqtt_x", {"group": "g"}, 3.0)).encode())
    text = registry.exposition().decode()
    assert text.startswith(generate_latest(registry).decode())
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert [(s.labels, s.value) for s in families["mqtt_x"].samples] == [({"group": "g"}, 3.0)]
    assert "mqtt_messages_received" in families
