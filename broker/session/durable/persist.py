"""Messages bound for durable sessions, handed to Durable Storage once per event-loop turn.

A burst of PUBLISHes read from one socket becomes one `store_batch` call and one future that
all their acknowledgements wait on, instead of a call, a shard grouping and a future per
message (which showed up as the largest single cost of the durable publish path).
"""

import asyncio

from broker.ds import TTV, DurableStorage
from broker.session.durable.turn import PerTurn


class MessagePersister:
    __slots__ = ("_turn",)

    def __init__(self, ds: DurableStorage) -> None:
        self._turn: PerTurn[TTV] = PerTurn(lambda batch: ds.store_batch("messages", batch))

    def add(self, message: TTV) -> asyncio.Future[None]:
        """Resolves once the message is on disk (with the rest of its turn's batch)."""
        return self._turn.add(message)
