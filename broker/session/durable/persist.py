"""Messages bound for durable sessions, handed to Durable Storage once per event-loop turn.

A burst of PUBLISHes read from one socket becomes one `store_batch` call and one future that
all their acknowledgements wait on, instead of a call, a shard grouping and a future per
message (which showed up as the largest single cost of the durable publish path).
"""

import asyncio

from broker.ds import TTV, DurableStorage


class MessagePersister:
    __slots__ = ("_batch", "_done", "_ds")

    def __init__(self, ds: DurableStorage) -> None:
        self._ds = ds
        self._batch: list[TTV] = []
        self._done: asyncio.Future[None] | None = None

    def add(self, message: TTV) -> asyncio.Future[None]:
        """Resolves once the message is on disk (with the rest of its turn's batch)."""
        done = self._done
        if done is None:
            loop = asyncio.get_running_loop()
            done = self._done = loop.create_future()
            loop.call_soon(self._flush)
        self._batch.append(message)
        return done

    def _flush(self) -> None:
        batch, done = self._batch, self._done
        self._batch, self._done = [], None
        assert done is not None
        stored = asyncio.ensure_future(self._ds.store_batch("messages", batch))
        stored.add_done_callback(lambda result: _settle(done, result))


def _settle(done: asyncio.Future[None], result: asyncio.Future[None]) -> None:
    if done.done():
        return
    if result.cancelled():
        done.cancel()
    elif result.exception() is not None:
        done.set_exception(result.exception())  # type: ignore[arg-type]
    else:
        done.set_result(None)
