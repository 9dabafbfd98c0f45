"""Run a maintenance job at a fixed interval until cancelled.

One loop for every timer of a node (retained-message clearing, DS generations and retention,
the durable-session heartbeat and garbage collector), so each gets the same rule: a round
that fails is logged and the next round still runs.
"""

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def every(
    interval: float, job: Callable[[], Awaitable[object] | object], *, at_once: bool = False
) -> None:
    """Calls (and awaits, if it returns an awaitable) `job` every `interval` seconds; the
    first call comes at once with `at_once`, otherwise after one interval."""
    if not at_once:
        await asyncio.sleep(interval)
    while True:
        try:
            result = job()
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("periodic job %s failed", getattr(job, "__name__", job))
        await asyncio.sleep(interval)
