"""Password checks on worker threads, their answers handed back to the event loop in batches.

`run_in_executor` costs a CONNECT with a password more than the rest of its handling: two
futures chained across threads, a work item, and a write to the loop's self-pipe and a
wake-up for every answer. Here a check is a tuple on a queue, and a worker that finds the
loop already told of finished checks adds its answer to theirs: in a storm of CONNECTs one
wake-up delivers many answers. An answer goes to a plain callback, not a future: a future
would schedule its callbacks for another loop turn, and a CONNECT waiting for its password
continues without a Task (handlers/connect.py). Checks are queued once a loop turn, as a
list per worker: queued one by one as the CONNECTs are read, each woke a worker that then
took the GIL at every system call of the loop's reads (a broker pinned to one core made 2.8
context switches per CONNECT, against 1.0). The hash itself runs as before (`hashlib`
releases the GIL).
"""

import asyncio
import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Check = Callable[[], bool]
# Given the check's result, or what it raised (as an executor hands it to its awaiter).
Done = Callable[[bool | BaseException], None]


class HashWorkers:
    def __init__(self, threads: int, name: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._jobs: queue.SimpleQueue[list[tuple[Check, Done]] | None] = queue.SimpleQueue()
        self._answers: list[tuple[Done, bool | BaseException]] = []
        self._outbox: list[tuple[Check, Done]] = []  # checks of this loop turn, not yet queued
        self._lock = threading.Lock()  # guards `_answers` and `_told`
        self._told = False  # the loop has a `_deliver` coming
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
                         for n in range(threads)]
        for thread in self._threads:
            thread.start()

    def check(self, check: Check, done: Done) -> None:
        """`check()` runs on a worker thread; `done` gets its answer on the loop (never
        when the loop has closed first)."""
        if not self._outbox:
            self._loop.call_soon(self._submit)
        self._outbox.append((check, done))

    def _submit(self) -> None:
        jobs, self._outbox = self._outbox, []
        threads = len(self._threads)
        for n in range(min(threads, len(jobs))):
            self._jobs.put(jobs[n::threads])

    def stop(self) -> None:
        """The workers end once the checks queued are done (their answers are dropped when
        the loop is gone)."""
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        while (jobs := self._jobs.get()) is not None:
            for check, done in jobs:
                result: bool | BaseException
                try:
                    result = check()
                except BaseException as exc:  # handed to the waiting CONNECT, as an executor does
                    result = exc
                with self._lock:
                    self._answers.append((done, result))
                    if self._told:
                        continue
                    self._told = True
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    return

    def _deliver(self) -> None:
        with self._lock:
            answers, self._answers, self._told = self._answers, [], False
        for done, result in answers:
            try:
                done(result)
            except Exception:  # one CONNECT's bug must not strand the others of the batch
                log.exception("password check callback failed")
