"""Password checks on worker threads, their answers handed back to the event loop in batches.

`run_in_executor` costs a CONNECT with a password more than the rest of its handling: two
futures chained across threads, a work item, and a write to the loop's self-pipe and a
wake-up for every answer. Here a check is a tuple on a queue, and a worker that finds the
loop already told of finished checks adds its answer to theirs: in a storm of CONNECTs one
wake-up delivers many answers. The hash itself runs as before (`hashlib` releases the GIL).
"""

import asyncio
import queue
import threading
from collections.abc import Callable

Check = Callable[[], bool]
_Answer = tuple["asyncio.Future[bool]", bool, BaseException | None]


class HashWorkers:
    def __init__(self, threads: int, name: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._jobs: queue.SimpleQueue[tuple[asyncio.Future[bool], Check] | None] = (
            queue.SimpleQueue())
        self._answers: list[_Answer] = []
        self._lock = threading.Lock()  # guards `_answers` and `_told`
        self._told = False  # the loop has a `_deliver` coming
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
                         for n in range(threads)]
        for thread in self._threads:
            thread.start()

    def check(self, check: Check) -> "asyncio.Future[bool]":
        """`check()`'s result, computed on a worker thread."""
        answer = self._loop.create_future()
        self._jobs.put((answer, check))
        return answer

    def stop(self) -> None:
        """The workers end once the checks queued are done (their answers are dropped when
        the loop is gone)."""
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            answer, check = job
            result, error = False, None
            try:
                result = check()
            except BaseException as exc:  # handed to the waiting CONNECT, as an executor does
                error = exc
            with self._lock:
                self._answers.append((answer, result, error))
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
        for answer, result, error in answers:
            if answer.cancelled():  # the CONNECT's connection closed meanwhile
                continue
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(result)
