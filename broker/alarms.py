"""The node's alarms, as EMQX keeps them: a condition an operator must act on, raised by name
while it lasts and cleared when it ends.

An alarm is active at most once per name: raising it again while active changes nothing (the
first cause and time stay, which is what the operator needs to see), so a component may raise
it on every failure without flooding the `$SYS` alarm topics. Cleared alarms are kept for
`GET /api/v5/alarms?activated=false`, the newest `HISTORY` of them.

Each change is handed to `on_change` (the node publishes it to `$SYS/brokers/<node>/alarms/
activate` or `.../deactivate` and logs it); `samples` is `mqtt_alarm_active{alarm=...}`, 1
or 0, with a 0 for every alarm this broker knows (`KNOWN`) from the start, so a Prometheus
rule sees the series before the first time it fires.
"""

import datetime
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final

from broker.ds.space import DISK_FULL, QUOTA

__all__ = ["DISK_FULL", "KNOWN", "QUOTA", "Alarm", "Alarms"]

KNOWN: Final = (DISK_FULL, QUOTA)
HISTORY: Final = 100

# (name, kind, help, labels, value): broker.stats.Sample, without importing it.
Sample = tuple[str, str, str, dict[str, str], float]


class Alarm:
    """(A plain class: a dataclass costs a start ~1 ms of CPU to build, issue 42.)"""

    __slots__ = ("activate_at", "deactivate_at", "details", "message", "name", "node")

    def __init__(self, name: str, message: str, details: dict[str, Any], activate_at: float,
                 deactivate_at: float | None = None, node: str = "") -> None:
        self.name = name
        self.message = message
        self.details = details
        self.activate_at = activate_at  # seconds since the epoch
        self.deactivate_at = deactivate_at
        self.node = node

    @property
    def activated(self) -> bool:
        return self.deactivate_at is None

    def to_json(self) -> dict[str, Any]:
        """EMQX's shape (GET /api/v5/alarms, the `$SYS` alarm messages)."""
        end = self.deactivate_at
        return {
            "node": self.node, "name": self.name, "message": self.message,
            "details": self.details, "activated": self.activated,
            "activate_at": _rfc3339(self.activate_at),
            "deactivate_at": "infinity" if end is None else _rfc3339(end),
            "duration": int(((end or time.time()) - self.activate_at) * 1000),
        }


class Alarms:
    def __init__(self, node: str, on_change: Callable[[Alarm], object] | None = None) -> None:
        self.node = node
        self.on_change = on_change
        self._active: dict[str, Alarm] = {}
        self._cleared: deque[Alarm] = deque(maxlen=HISTORY)

    def activate(self, name: str, message: str, details: dict[str, Any] | None = None) -> bool:
        """Raises `name`; False when it was active already (nothing changes then)."""
        if name in self._active:
            return False
        alarm = self._active[name] = Alarm(name, message, details or {}, time.time(),
                                           node=self.node)
        if self.on_change is not None:
            self.on_change(alarm)
        return True

    def deactivate(self, name: str) -> bool:
        """Clears `name`; False when it was not active."""
        alarm = self._active.pop(name, None)
        if alarm is None:
            return False
        alarm.deactivate_at = time.time()
        self._cleared.appendleft(alarm)
        if self.on_change is not None:
            self.on_change(alarm)
        return True

    def is_active(self, name: str) -> bool:
        return name in self._active

    def listed(self, activated: bool | None = None) -> list[Alarm]:
        """Active ones (newest first), cleared ones (newest first), or both."""
        active = sorted(self._active.values(), key=lambda a: -a.activate_at)
        if activated is None:
            return [*active, *self._cleared]
        return active if activated else list(self._cleared)

    def samples(self) -> Iterable[Sample]:
        names = dict.fromkeys([*KNOWN, *self._active])
        for name in names:
            yield ("mqtt_alarm_active", "gauge",
                   "1 while the alarm is active (GET /api/v5/alarms), else 0",
                   {"alarm": name}, float(name in self._active))


def _rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).astimezone().isoformat(
        timespec="milliseconds")
