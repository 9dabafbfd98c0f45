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
from collections.abc import Awaitable, Callable
from typing import Final

from broker.retainer.machine import encode_commands
from broker.session.message import Message

log = logging.getLogger(__name__)

MAX_BATCH_BYTES: Final = 1 << 20


class CommitTimeout(Exception):
    pass


class Batch:
    """Commands that become one log entry, and the one future they all wait on: the
    PUBLISHes of a batch are acknowledged together (a connection groups acknowledgements
    that share a future: one callback per batch, not per message)."""

    __slots__ = ("commands", "future", "messages", "size", "started")

    def __init__(self, future: "asyncio.Future[None]") -> None:
        self.commands: list[bytes] = []
        self.future = future
        self.size = 0
        self.started = future.get_loop().time()
        self.messages: list[Message] = []  # the commands' messages, kept by the caller


class Proposer:
    def __init__(self, submit: Callable[[Batch, bytes], Awaitable[None]],
                 timeout: float) -> None:
        self._submit = submit
        self.timeout = timeout
        self._queue: list[Batch] = []  # the last one is still taking commands
        self._inflight: Batch | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.batches = 0
        self.commands = 0
        self.timed_out = 0

    def __len__(self) -> int:
        return sum(len(batch.commands) for batch in self._queue)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stops proposing. What waits is left waiting: at shutdown its connections are
        closed already (`abandon` fails it, for a node that goes on)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def abandon(self) -> None:
        """Fails what waits (cancelled: not acknowledged, the clients' connections close)."""
        for batch in ([self._inflight] if self._inflight else []) + self._queue:
            batch.future.cancel()
        self._queue.clear()

    def add(self, command: bytes) -> Batch:
        """Queues a command; its batch's future resolves once it is committed."""
        queue = self._queue
        if not queue or queue[-1].size + len(command) > MAX_BATCH_BYTES:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            # Nobody may await it (a retained $SYS message): its failure is logged by _commit.
            future.add_done_callback(_retrieve)
            queue.append(Batch(future))
            self._wake.set()
        batch = queue[-1]
        batch.commands.append(command)
        batch.size += len(command)
        return batch

    async def _run(self) -> None:
        while not self._stopped:
            await self._wake.wait()
            self._wake.clear()
            while self._queue and not self._stopped:
                self._inflight = self._queue.pop(0)
                await self._commit(self._inflight)
                self._inflight = None

    async def _commit(self, batch: Batch) -> None:
        data = encode_commands(batch.commands)
        future, count = batch.future, len(batch.commands)
        try:
            # (A timeout scope, not wait_for: no task per batch, no cancellation swallowed.)
            async with asyncio.timeout_at(batch.started + self.timeout):
                await self._submit(batch, data)
        except TimeoutError:
            self.timed_out += count
            error = CommitTimeout(f"not committed within {self.timeout:g} s (no leader"
                                  " reachable: this node is on a minority's side?)")
            log.warning("%d retained message(s) not stored: %s", count, error)
            if not future.done():
                future.set_exception(error)
            return
        except Exception as error:  # a bug: fail the batch, keep the proposer alive
            log.exception("%d retained message(s) not stored", count)
            if not future.done():
                future.set_exception(error)
            return
        self.batches += 1
        self.commands += count
        if not future.done():
            future.set_result(None)


def _retrieve(future: "asyncio.Future[None]") -> None:
    """Marks the failure as seen, so asyncio does not report it again at collection."""
    if not future.cancelled():
        future.exception()
