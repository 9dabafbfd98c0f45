"""Reconciles that run again without any Kubernetes event: a drain or replica transitions the
brokers have not confirmed yet, a cluster whose brokers seal generations for Spark, a
reconcile the API server failed.

The operator's own thread, not kopf's retries: a handler that kopf retries keeps kopf's
diff base at the spec it last finished, so a spec edited back to that value meanwhile (scale
3 -> 5 and back to 3 while the new replicas copy) is no change to kopf, and no handler ever
runs for it. Handlers here always finish; what must come again is scheduled below, and every
reconcile reads the current spec, whatever woke it.
"""

import contextvars
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Key = tuple[str, str]  # (namespace, name) of an MQTTCluster


def delay(waiting: bool, polls: bool, wait: float, poll: float) -> float | None:
    """Seconds until a cluster's next reconcile without an event; None: only events bring it.
    Brokers confirming a drain or a transition are the soonest news, so they win."""
    if waiting:
        return wait
    return poll if polls else None


@dataclass
class Schedule:
    """Due times (monotonic seconds) of the clusters to reconcile again: one per cluster, the
    last reconcile's decision replacing any earlier one."""

    due: dict[Key, float] = field(default_factory=dict)

    def set(self, key: Key, after: float | None, now: float) -> None:
        if after is None:
            self.due.pop(key, None)
        else:
            self.due[key] = now + after

    def take(self, now: float) -> list[Key]:
        """The clusters due by `now`, removed: their reconcile schedules them again."""
        ready = sorted(key for key, when in self.due.items() if when <= now)
        for key in ready:
            del self.due[key]
        return ready

    def wait(self, now: float) -> float | None:
        """Seconds until the earliest due time (0 when overdue); None when nothing is due."""
        return max(0.0, min(self.due.values()) - now) if self.due else None


class Resync:
    """A thread that runs `reconcile` for each cluster when the schedule says so. A cluster
    that reconciles (from any trigger) calls `after` with its decision; the thread wakes at
    once when that moves the earliest due time. `reconcile` runs in a copy of the context of
    the first `after` call: kopf posts Events only from its handlers' context."""

    def __init__(self, reconcile: Callable[[Key], None]) -> None:
        self._reconcile = reconcile
        self._context: contextvars.Context | None = None
        self._schedule = Schedule()
        self._changed = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="resync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join()

    def after(self, key: Key, seconds: float | None) -> None:
        with self._changed:
            self._context = self._context or contextvars.copy_context()
            self._schedule.set(key, seconds, time.monotonic())
            self._changed.notify()

    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self._stopped and not (
                        due := self._schedule.take(time.monotonic())):
                    self._changed.wait(self._schedule.wait(time.monotonic()))
                if self._stopped:
                    return
                context = self._context
            assert context is not None  # nothing is due before the first `after`
            for key in due:
                context.copy().run(self._reconcile, key)
