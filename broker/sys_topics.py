"""The node's own `$SYS` topics, in EMQX's layout, and the rule that clients may not write them.

MQTT reserves topics starting with `$` for the server (section 4.7.2), and subscribers of
`$SYS/#` trust what they read there; so a client's PUBLISH to a `$SYS` topic is refused
unless `sys_topics.allow_client_publish` is set. Every `sys_topics.sys_msg_interval` the
node publishes, as EMQX does (retained where EMQX retains):

    $SYS/brokers                                  node names, comma-separated   retained
    $SYS/brokers/<node>/version                   broker version                retained
    $SYS/brokers/<node>/sysdescr                  broker description            retained
    $SYS/brokers/<node>/uptime                    milliseconds since start
    $SYS/brokers/<node>/datetime                  RFC 3339 local time
    $SYS/brokers/<node>/stats/<name>/count        connections, sessions, subscriptions,
                                                  retained
    $SYS/brokers/<node>/metrics/<kind>/<event>    messages/received, messages/sent,
                                                  messages/dropped, bytes/received, bytes/sent

and, when an alarm is raised or cleared (broker/alarms.py), at once:

    $SYS/brokers/<node>/alarms/activate           the alarm as GET /api/v5/alarms shows it
    $SYS/brokers/<node>/alarms/deactivate         (JSON)
"""

import datetime
import json
import time
from collections.abc import Callable
from typing import Final

from broker.alarms import Alarm
from broker.retainer.store import RetainedStore
from broker.session.message import Message
from broker.stats import Stats

DESCRIPTION: Final = "Durable MQTT broker"
_BROKER: Final = ""  # the publisher of the broker's own messages: no client has this ID

Publish = Callable[[Message], object]


def is_sys_topic(topic: str) -> bool:
    return topic == "$SYS" or topic.startswith("$SYS/")


def sys_messages(node: str, version: str, uptime: float, now: datetime.datetime,
                 gauges: dict[str, tuple[str, float]], stats: Stats) -> list[Message]:
    """What one round publishes: `uptime` in seconds, `gauges` as Node.gauges() reports."""
    base = f"$SYS/brokers/{node}/"
    retained = [("$SYS/brokers", node), (base + "version", version),
                (base + "sysdescr", DESCRIPTION)]
    counts = {
        "stats/connections/count": gauges["mqtt_connections"][1],
        "stats/sessions/count": gauges["mqtt_sessions"][1],
        "stats/subscriptions/count": gauges["mqtt_subscriptions"][1],
        "stats/retained/count": gauges["mqtt_retained_messages"][1],
        "metrics/messages/received": sum(stats.messages_received),
        "metrics/messages/sent": sum(stats.messages_sent),
        "metrics/messages/dropped": sum(stats.messages_dropped.values()),
        "metrics/bytes/received": stats.bytes_received,
        "metrics/bytes/sent": stats.bytes_sent,
    }
    current = [(base + "uptime", str(int(uptime * 1000))),
               (base + "datetime", now.isoformat(timespec="seconds")),
               *((base + name, str(int(value))) for name, value in counts.items())]
    return [Message(topic, text.encode(), 0, True, _BROKER) for topic, text in retained] + [
        Message(topic, text.encode(), 0, False, _BROKER) for topic, text in current]


def alarm_message(node: str, alarm: Alarm) -> Message:
    """An alarm raised or cleared, as EMQX publishes it (QoS 0, not retained)."""
    change = "activate" if alarm.activated else "deactivate"
    return Message(f"$SYS/brokers/{node}/alarms/{change}", json.dumps(alarm.to_json()).encode(),
                   0, False, _BROKER)


def remove_client_written(retainer: RetainedStore) -> int:
    """Deletes the retained `$SYS` messages a client published (before clients were
    refused: a data directory of an older version); returns how many."""
    written = [m.topic for m in retainer.match("$SYS/#") if m.publisher != _BROKER]
    for topic in written:
        retainer.put(Message(topic, b"", 0, True, _BROKER))
    return len(written)


class SysTopics:
    """Publishes a round of `sys_messages` whenever called (the node's timer calls it)."""

    def __init__(self, node: str, version: str, publish: Publish,
                 gauges: Callable[[], dict[str, tuple[str, float]]], stats: Stats) -> None:
        self._node = node
        self._version = version
        self._publish = publish
        self._gauges = gauges
        self._stats = stats
        self._started = time.monotonic()

    def publish(self) -> None:
        for message in sys_messages(self._node, self._version, time.monotonic() - self._started,
                                    datetime.datetime.now().astimezone(), self._gauges(),
                                    self._stats):
            self._publish(message)
