"""How many stored messages an offline durable session has missed, counted as they come.

The dashboard asks every second. Counting from the disconnect each time would read a
session's whole backlog per poll; instead each offline session keeps, per subscription and
stream, where counting stopped, and a poll reads only what was stored since. A session that
reconnects (or disconnects again: a new `disconnected_at`) starts a new tally. Counting stops
at `cap` per session so that one huge backlog costs a bounded read, once.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from broker.ds import DurableStorage
from broker.ds.iterator import Iterator, Stream

_READ_BATCH: Final = 1000


@dataclass
class _Tally:
    away_since: float
    total: int = 0
    # (filter, stream) -> where counting stopped; None once the stream is read to its end.
    positions: dict[tuple[str, Stream], Iterator | None] = field(default_factory=dict)


class MissedCounts:
    def __init__(self, ds: DurableStorage, cap: int) -> None:
        self._ds = ds
        self.cap = cap
        self._tallies: dict[str, _Tally] = {}

    def count(self, client_id: str, away_since: float | None,
              since: Mapping[str, int]) -> int:
        """Stored messages matching a session's stored subscriptions (`since`: filter ->
        from when it is stored, microseconds) since its client left (`away_since`, None
        while connected), each subscription counted apart (each gets its own delivery), up
        to `cap`."""
        if away_since is None:
            self._tallies.pop(client_id, None)
            return 0
        tally = self._tallies.get(client_id)
        if tally is None or tally.away_since != away_since:
            tally = self._tallies[client_id] = _Tally(away_since)
        for topic_filter, subscribed_at in list(since.items()):
            self._count_filter(tally, topic_filter,
                               max(int(away_since * 1_000_000), subscribed_at))
        return tally.total

    def _count_filter(self, tally: _Tally, topic_filter: str, start: int) -> None:
        ds = self._ds
        for stream in ds.get_streams("messages", topic_filter, start):
            key = (topic_filter, stream)
            iterator = (tally.positions[key] if key in tally.positions
                        else ds.make_iterator(stream, topic_filter, start))
            while iterator is not None and tally.total < self.cap:
                after, batch = ds.next(iterator, min(_READ_BATCH, self.cap - tally.total))
                tally.total += len(batch)
                iterator = after
                if not batch:
                    break
            tally.positions[key] = iterator

    def forget_all_but(self, offline: set[str]) -> None:
        """Drops the tallies of sessions no longer offline here (resumed, ended, moved)."""
        for client_id in self._tallies.keys() - offline:
            del self._tallies[client_id]
