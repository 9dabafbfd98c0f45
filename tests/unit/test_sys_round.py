"""The `$SYS` round's content (EMQX's layout) and which topics are the broker's."""

import datetime

import pytest

from broker.stats import Stats
from broker.sys_topics import is_sys_topic, sys_messages


@pytest.mark.parametrize(("topic", "reserved"), [
    ("$SYS", True), ("$SYS/broker/version", True), ("$SYS/", True),
    ("$SYSTEM/x", False), ("$sys/x", False), ("a/$SYS/x", False), ("$share/g/t", False),
])
def test_which_topics_are_the_brokers(topic: str, reserved: bool) -> None:
    assert is_sys_topic(topic) is reserved


def test_a_round_in_emqx_layout() -> None:
    stats = Stats()
    stats.messages_received = [1, 2, 3]
    stats.messages_sent = [4, 0, 1]
    stats.drop("no_subscribers", 7)
    stats.bytes_received, stats.bytes_sent = 1000, 2000
    gauges = {name: ("", value) for name, value in (
        ("mqtt_connections", 5), ("mqtt_sessions", 6), ("mqtt_subscriptions", 8),
        ("mqtt_retained_messages", 9))}
    now = datetime.datetime(2026, 1, 2, 3, 4, 5, 600_000, tzinfo=datetime.UTC)
    round_ = sys_messages("n@h", "1.2.3", 12.3456, now, gauges, stats)
    base = "$SYS/brokers/n@h/"
    assert {m.topic: (m.payload.decode(), m.retain, m.qos, m.publisher) for m in round_} == {
        "$SYS/brokers": ("n@h", True, 0, ""),
        base + "version": ("1.2.3", True, 0, ""),
        base + "sysdescr": ("Durable MQTT broker", True, 0, ""),
        base + "uptime": ("12345", False, 0, ""),
        base + "datetime": ("2026-01-02T03:04:05+00:00", False, 0, ""),
        base + "stats/connections/count": ("5", False, 0, ""),
        base + "stats/sessions/count": ("6", False, 0, ""),
        base + "stats/subscriptions/count": ("8", False, 0, ""),
        base + "stats/retained/count": ("9", False, 0, ""),
        base + "metrics/messages/received": ("6", False, 0, ""),
        base + "metrics/messages/sent": ("5", False, 0, ""),
        base + "metrics/messages/dropped": ("7", False, 0, ""),
        base + "metrics/bytes/received": ("1000", False, 0, ""),
        base + "metrics/bytes/sent": ("2000", False, 0, ""),
    }
