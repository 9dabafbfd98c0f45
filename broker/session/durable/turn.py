"""Event-loop turns: work collected during one and handed on in one call, and work too
long for one, spread over several.

The durable hot path produces many small writes per turn (a message per PUBLISH read, an
acknowledgement per PUBACK, a batch record per read batch). A call, a transaction and a
future per write was the largest fixed cost of that path; collected, they cost one each per
turn, and everyone who added something waits on the same future.

One client's request may carry a lot of work (a SUBSCRIBE of 50,000 filters, a durable
session resuming that many): done in one go it would stall every other connection for
seconds, so such work runs in `TimeSlice`s and lets the loop run in between.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Final, Generic, TypeVar

T = TypeVar("T")

SLICE_SECONDS: Final = 0.002
"""How long one client's request may hold the event loop before others get a turn."""


class TimeSlice:
    """A budget of event-loop time: work checks `spent` between steps and, once it is,
    awaits `next`, which lets everything else run before the next slice starts."""

    __slots__ = ("_end",)

    def __init__(self) -> None:
        self._end = time.monotonic() + SLICE_SECONDS

    def spent(self) -> bool:
        return time.monotonic() >= self._end

    async def next(self) -> None:
        await asyncio.sleep(0)
        self._end = time.monotonic() + SLICE_SECONDS


def run_in_slices(steps: Iterator[None]) -> "asyncio.Task[None] | None":
    """Runs `steps` (a generator that yields between steps of its work) for one slice now
    and the rest a slice per event-loop turn; returns the task doing the rest, if any."""
    budget = TimeSlice()
    if _run_slice(steps, budget):
        return None
    return asyncio.get_running_loop().create_task(_run_rest(steps, budget))


def _run_slice(steps: Iterator[None], budget: TimeSlice) -> bool:
    """True once `steps` is exhausted; False when the budget ran out first."""
    return all(not budget.spent() for _ in steps)


async def _run_rest(steps: Iterator[None], budget: TimeSlice) -> None:
    while True:
        await budget.next()
        if _run_slice(steps, budget):
            return


class PerTurn(Generic[T]):
    __slots__ = ("_done", "_flush", "_hooks", "_items")

    def __init__(self, flush: Callable[[list[T]], Awaitable[None]]) -> None:
        self._flush = flush
        self._items: list[T] = []
        self._hooks: list[Callable[[], None]] = []
        self._done: asyncio.Future[None] | None = None

    @property
    def pending(self) -> bool:
        """Something waits for this turn's flush."""
        return self._done is not None

    def before_flush(self, hook: Callable[[], None]) -> None:
        """Runs `hook` at this turn's flush, before what was collected is handed on (it may
        add more): work that is itself once per turn joins the same flush instead of taking
        an event-loop iteration of its own first."""
        if self._done is None:
            self._open()
        self._hooks.append(hook)

    def add(self, item: T) -> asyncio.Future[None]:
        """Resolves once this turn's flush completed (fails if it failed)."""
        done = self._done or self._open()
        self._items.append(item)
        return done

    def extend(self, items: Iterable[T]) -> asyncio.Future[None]:
        done = self._done or self._open()
        self._items.extend(items)
        return done

    def _open(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        done = self._done = loop.create_future()
        loop.call_soon(self.flush_now)
        return done

    def flush_now(self) -> None:
        """Hands on what was collected (at the end of the turn, or before a reader that must
        see it)."""
        if self._done is None:
            return
        hooks = self._hooks
        if hooks:
            self._hooks = []
            for hook in hooks:
                hook()
        items, done = self._items, self._done
        self._items, self._done = [], None
        try:
            flushed = asyncio.ensure_future(self._flush(items))
        except Exception as exc:  # refused at once (e.g. a failed validation)
            done.set_exception(exc)
            return
        if flushed.done():  # written at once (no fsync): no callback round to wait for
            _settle(done, flushed)
        else:
            flushed.add_done_callback(lambda result: _settle(done, result))


def _settle(done: asyncio.Future[None], result: asyncio.Future[None]) -> None:
    if done.done():
        return
    if result.cancelled():
        done.cancel()
    elif result.exception() is not None:
        done.set_exception(result.exception())  # type: ignore[arg-type]
        # Marked as seen: the flush's owner reports failures, and a turn may have no waiter.
        done.exception()
    else:
        done.set_result(None)
