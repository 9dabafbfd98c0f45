"""Commands into a Raft log in the order they were given, in batches, one batch in flight.

A retained PUBLISH becomes a command; its acknowledgement waits for the future `add` returns.
Commands that arrive while a batch is being committed form the next batch (one log entry),
so the log's write rate follows the disk and the network, not the PUBLISH rate. Keeping one
batch in flight keeps each node's commands in order through leader changes: a batch that
failed is retried, whole, before any later one. A retried batch that had in fact been
committed (its answer was lost) is applied twice; setting a retained message twice in a row
changes nothing.

A command not committed within `timeout` of being given fails with CommitTimeout (its
PUBLISH is then not acknowledged and the client's connection is closed, so it resends,
perhaps to a node on the majority's side).
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from broker.retainer.machine import encode_commands

log = logging.getLogger(__name__)

MAX_BATCH_BYTES: Final = 1 << 20


class CommitTimeout(Exception):
    pass


class Proposer:
    def __init__(self, submit: Callable[[bytes], Awaitable[None]], timeout: float) -> None:
        self._submit = submit
        self.timeout = timeout
        self._queue: list[tuple[bytes, asyncio.Future[None], float]] = []
        self._inflight: list[tuple[bytes, asyncio.Future[None], float]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.commands = 0
        self.timed_out = 0

    def __len__(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for _, future, _ in self._inflight + self._queue:
            future.cancel()
        self._queue.clear()

    def add(self, command: bytes) -> "asyncio.Future[None]":
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Nobody may await it (a retained $SYS message): its failure is logged by _commit.
        future.add_done_callback(_retrieve)
        self._queue.append((command, future, time.monotonic()))
        self._wake.set()
        return future

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                self._inflight = self._take()
                await self._commit(self._inflight)
                self._inflight = []

    def _take(self) -> list[tuple[bytes, "asyncio.Future[None]", float]]:
        queue = self._queue
        size = 0
        end = 0
        while end < len(queue) and (end == 0 or size + len(queue[end][0]) <= MAX_BATCH_BYTES):
            size += len(queue[end][0])
            end += 1
        batch, self._queue = queue[:end], queue[end:]
        return batch

    async def _commit(self, batch: list[tuple[bytes, "asyncio.Future[None]", float]]) -> None:
        data = encode_commands([command for command, _, _ in batch])
        remaining = batch[0][2] + self.timeout - time.monotonic()
        try:
            await asyncio.wait_for(self._submit(data), max(remaining, 0.0))
        except TimeoutError:
            self.timed_out += len(batch)
            error = CommitTimeout(f"not committed within {self.timeout:g} s (no leader"
                                  " reachable: this node is on a minority's side?)")
            log.warning("%d retained message(s) not stored: %s", len(batch), error)
            for _, future, _ in batch:
                if not future.done():
                    future.set_exception(error)
            return
        self.batches += 1
        self.commands += len(batch)
        for _, future, _ in batch:
            if not future.done():
                future.set_result(None)


def _retrieve(future: "asyncio.Future[None]") -> None:
    """Marks the failure as seen, so asyncio does not report it again at collection."""
    if not future.cancelled():
        future.exception()
