"""Durable session state in the `sessions` database: load it, change it, delete it.

Every change is a blind write (no reads recorded), so changes never conflict. The changes
of one event-loop turn, of every session, are written as one atomic batch (no transaction:
there is nothing to validate) through the storage's group commit (the last change of a key
wins), with fsync unless every change of the turn is one whose loss costs only a redelivery
(acknowledgements): such a turn is written without fsync, which survives the process being
killed, not a power cut. The key-value store shows a committed change to readers at once,
before it is on disk, and every read here commits the turn's changes first, so a session
that is detached and immediately resumed reads its latest state. Changes whose completion
no one awaits are tracked, so shutdown can wait for them and a failure is logged, not lost.
"""

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from broker.ds import DurableStorage, Stream
from broker.ds.kv import written_then_deleted
from broker.session.durable import group_records as g
from broker.session.durable import records as r
from broker.session.durable.turn import PerTurn
from broker.session.session import SubscriptionOptions

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StoredSession:
    client_id: str
    meta: r.Meta
    subscriptions: dict[str, tuple[SubscriptionOptions, int]] = field(default_factory=dict)
    batches: list[r.BatchRecord] = field(default_factory=list)
    released: set[int] = field(default_factory=set)
    awaiting_rel: set[int] = field(default_factory=set)
    acked: dict[int, list[int]] = field(default_factory=dict)  # batch first seqno -> offsets


def _attach_acks(stored: StoredSession) -> None:
    stored.batches.sort(key=lambda batch: batch.first_seqno)
    for batch in stored.batches:
        batch.done = stored.acked.get(batch.first_seqno, [])


Write = tuple[bytes, bytes | None]  # None deletes
# Every kind of key a session has besides its meta (see records.py).
_STATE_KINDS: Final = (b"s", b"p", b"b", b"k", b"r", b"a")
# What was in flight: rebuilt when the client of a session restored at start-up is back.
_IN_FLIGHT_KINDS: Final = (b"b", b"k", b"r", b"a")


class SessionStore:
    def __init__(self, ds: DurableStorage) -> None:
        self._ds = ds
        self.site = ds.site_id
        self._turn: PerTurn[Write] = PerTurn(self._commit)
        self._sync = False  # whether this turn's commit needs fsync
        self._background: set[asyncio.Future[None]] = set()
        # Replicated (builtin_raft): a durable group's state is read as the replicas admitted
        # it, not with this node's writes still on their way, which they may refuse
        # (group_fencing.py): a position read from one would skip what it never recorded.
        self.committed_group_reads = False
        # Returned batches being taken here: not taken twice while the first take is on its
        # way (read as committed, they are still there).
        self.taking: set[bytes] = set()
        # The subscriptions to shares that `subscription_keys` found, for `groups` (once).
        self._start_shares: list[bytes] | None = None

    # ---- reading -----------------------------------------------------------------------
    def subscription_keys(self) -> Iterator[tuple[str, str]]:
        """(client ID, subscription key) of every stored subscription, from its key alone,
        as the caller goes (start-up: the durable filter index, before any session is
        loaded). The shares among them are kept for `groups`, which would otherwise read
        every subscription again."""
        self._turn.flush_now()
        shares: list[bytes] = []
        for key in self._ds.sessions.raw_keys(b"s" + r.SEP):
            # s\0<client id>\0<filter>: a client ID has no U+0000 (MQTT-1.5.4-2), a filter may
            client_id, _, topic_filter = key[2:].partition(r.SEP)
            if topic_filter.startswith(b"$share/"):
                shares.append(key)
            yield client_id.decode(), topic_filter.decode()
        self._start_shares = shares

    def stored_metas(self) -> Iterator[tuple[str, r.Meta]]:
        """Every stored session's meta, as the caller goes, from a snapshot of the database
        taken at the first (start-up: when each session is due)."""
        self._turn.flush_now()
        for key, value in self._ds.sessions.raw_iter(b"m" + r.SEP):
            yield r.split_key(key)[1], r.Meta.from_bytes(value)

    def meta(self, client_id: str) -> r.Meta | None:
        self._turn.flush_now()
        raw = self._ds.sessions.get(r.meta_key(client_id))
        return None if raw is None else r.Meta.from_bytes(raw)

    def load(self, client_id: str, subscriptions: bool = False) -> StoredSession | None:
        """The session's meta and what it had in flight; not its read positions
        (`load_positions`, per filter as its readers start: with many thousands of filters,
        reading them all at once would stall the node while the client reconnects), and its
        subscriptions only when asked (a session loaded again after it was out of memory,
        or coming from another node)."""
        meta = self.meta(client_id)
        if meta is None:
            return None
        stored = StoredSession(client_id, meta)
        kinds = (b"s", *_IN_FLIGHT_KINDS) if subscriptions else _IN_FLIGHT_KINDS
        found = self._ds.sessions.scan_many(r.prefix(kind, client_id) for kind in kinds)
        for kind, items in zip(kinds, found, strict=True):
            for key, value in items:
                self._add(stored, kind, key, value)
        _attach_acks(stored)
        return stored

    @staticmethod
    def _add(stored: StoredSession, kind: bytes, key: bytes, value: bytes) -> None:
        client_id = stored.client_id
        if kind == b"s":
            topic_filter = key[len(r.prefix(b"s", client_id)):].decode()
            stored.subscriptions[topic_filter] = r.subscription_from_bytes(value)
        elif kind == b"b":
            stored.batches.append(r.BatchRecord.from_bytes(value))
        elif kind == b"k":
            stored.acked[r.seqno_of_key(key)] = r.acked_from_bytes(value)
        elif kind == b"r":
            stored.released.add(r.seqno_of_key(key))
        elif kind == b"a":
            stored.awaiting_rel.add(r.packet_id_of_key(key))

    def metas(self) -> list[tuple[str, r.Meta]]:
        """Every stored session's meta (an ordered scan of the metas alone)."""
        self._turn.flush_now()
        return [(r.split_key(key)[1], r.Meta.from_bytes(value))
                for key, value in self._ds.sessions.scan(b"m" + r.SEP)]

    def tombstones(self) -> list[tuple[bytes, bytes]]:
        """Replicated: the ended sessions' epochs the replicas keep (ownership.py)."""
        return self._ds.sessions.scan(b"e" + r.SEP)

    def heartbeats(self) -> dict[str, float]:
        """Each site's last heartbeat (wall clock seconds)."""
        self._turn.flush_now()
        return {r.split_key(key)[1]: float(value)
                for key, value in self._ds.sessions.scan(b"h" + r.SEP)}

    def last_heartbeat(self) -> float | None:
        self._turn.flush_now()
        sessions = self._ds.sessions
        raw = sessions.get(r.heartbeat_key(self.site)) or sessions.get(r.LEGACY_HEARTBEAT_KEY)
        return float(raw) if raw is not None else None

    def heartbeat(self, now: float) -> None:
        self.write_soon([(r.heartbeat_key(self.site), repr(now).encode())])

    # ---- writing -----------------------------------------------------------------------
    def write(self, writes: Iterable[Write], sync: bool = True) -> asyncio.Future[None]:
        """Commits the writes atomically (with the rest of this turn's); resolves once
        they are on disk (`sync`), or written to the operating system, which a killed
        process cannot lose. Replicated, `sync` means committed on a majority of the
        sessions group; without it the future is settled at once and the commit follows
        (a killed node loses what was not committed yet)."""
        self._sync = self._sync or sync
        return self._turn.extend(writes)

    def write_soon(self, writes: Iterable[Write], sync: bool = True) -> None:
        """`write` for callers that need not wait: visible to readers at once, on disk
        within a flush interval. `sync=False` for acknowledgements, whose loss in a power
        cut costs a redelivery with DUP, which QoS 1 allows and QoS 2 resolves (a delivery
        whose PUBREC was recorded is resumed with PUBREL)."""
        self.write(writes, sync)

    def before_flush(self, hook: Callable[[], None]) -> None:
        """`hook` runs at this turn's commit, first (it may write)."""
        self._turn.before_flush(hook)

    def _commit(self, writes: list[Write]) -> asyncio.Future[None]:
        sync, self._sync = self._sync, False
        sessions = self._ds.sessions
        last = dict(writes)
        if sessions.replicate is not None:
            # A key written and deleted again within the turn (a batch record read, handed
            # back and done with) is written first: the replicas judge what a hand-back
            # refers to by it (group_fencing.py), and the flush keeps both (kv.py).
            undone = written_then_deleted(writes)
            if undone:
                sessions.write_soon(undone, sync)
        written = sessions.write_soon(last, sync)
        if written.done():  # written at once (no fsync): nothing left to track
            self._done(written)
        else:
            self._background.add(written)
            written.add_done_callback(self._done)
        return written

    def _done(self, done: asyncio.Future[None]) -> None:
        self._background.discard(done)
        if not done.cancelled() and done.exception() is not None:
            log.error("durable session state not written", exc_info=done.exception())

    @property
    def unsettled(self) -> int:
        """Commits started and not yet on disk, counting this turn's if it has one."""
        return len(self._background) + self._turn.pending

    async def settle(self) -> None:
        """Waits for every change started with `write_soon` (shutdown, a session leaving
        for another node), also those replicated behind a settled future."""
        self._turn.flush_now()
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        await self._ds.sessions.drain()

    def delete_writes(self, client_id: str) -> list[Write]:
        """Writes that remove every key of the session."""
        self._turn.flush_now()
        deletes: list[Write] = [(r.meta_key(client_id), None)]
        for kind in _STATE_KINDS:
            deletes.extend((key, None)
                           for key, _ in self._ds.sessions.scan(r.prefix(kind, client_id)))
        return deletes

    def load_positions(self, client_id: str, topic_filter: str) -> dict[Stream, int | None]:
        """Where the filter's streams were read to (microseconds), None for a stream read
        to its end."""
        self._turn.flush_now()
        positions: dict[Stream, int | None] = {}
        start = r.prefix(b"p", client_id) + topic_filter.encode() + r.SEP
        for key, value in self._ds.sessions.scan(start):
            _, shard, generation, stream = r.position_parts(key, client_id)
            positions[Stream("messages", shard, generation, stream)] = r.loads(value)["pos"]
        return positions

    @staticmethod
    def position_write(client_id: str, topic_filter: str, stream: Stream,
                       position: int | None) -> Write:
        return r.position_key(client_id, topic_filter, stream), r.dumps({"pos": position})

    # ---- durable shared-subscription groups (group_records.py) -------------------------
    def load_group_positions(self, share: str,
                             shard: int | None = None) -> dict[Stream, int | None]:
        """The group's read positions in the shard's streams (every shard's: None)."""
        self._turn.flush_now()
        positions: dict[Stream, int | None] = {}
        for key, value in self._group_scan(g.prefix(b"q", share)):
            stream = g.position_stream(key)
            if shard is None or stream.shard == shard:
                positions[stream] = r.loads(value)["pos"]
        return positions

    @staticmethod
    def group_position_write(share: str, stream: Stream, position: int | None,
                             member: str, tenure: int) -> Write:
        """The group's position, with the member that moved it and the tenure of its hold
        on the shard (group_fencing.py)."""
        value: dict[str, object] = {"pos": position, "by": member}
        if tenure:
            value["tenure"] = tenure
        return g.position_key(share, stream), r.dumps(value)

    def owner_tenure(self, share: str, shard: int) -> int:
        """The tenure of the shard's owner, as committed (replicated) or stored."""
        self._turn.flush_now()
        key = g.owner_key(share, shard)
        sessions = self._ds.sessions
        return g.Owner.tenure_of(sessions.raw_get(key) if self.committed_group_reads
                                 else sessions.get(key))

    def load_returned(self, share: str, shard: int
                      ) -> list[tuple[bytes, tuple[r.BatchRecord, bool]]]:
        """Deliveries of the shard's batches handed back to the group by its members
        (group_records.py): each batch, and whether they were never sent."""
        self._turn.flush_now()
        return [(key, g.returned_from_bytes(value))
                for key, value in self._group_scan(g.returned_prefix(share, shard))
                if key not in self.taking]

    def _group_scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        sessions = self._ds.sessions
        return sessions.raw_scan(prefix) if self.committed_group_reads else sessions.scan(prefix)

    def group_keys(self, share: str) -> list[bytes]:
        """Every key of the group's own state (not its members')."""
        self._turn.flush_now()
        keys = [key for kind in (b"o", b"q", b"x")
                for key, _ in self._ds.sessions.scan(g.prefix(kind, share))]
        return [g.group_key(share), *keys]

    def groups(self) -> tuple[dict[str, int], dict[str, dict[int, g.Owner]], list[bytes]]:
        """Every group's start, its shards' owners, and every key that is a subscription
        of a durable session to a share (scanned once at start-up, and when a replica's
        state is replaced by a snapshot)."""
        self._turn.flush_now()
        sessions = self._ds.sessions
        since = {r.split_key(key)[1]: g.group_since(value)
                 for key, value in sessions.scan(b"g" + r.SEP)}
        owners: dict[str, dict[int, g.Owner]] = {}
        for key, value in sessions.scan(b"o" + r.SEP):
            owners.setdefault(r.split_key(key)[1], {})[g.shard_of_key(key)] = \
                g.Owner.from_bytes(value)
        shares, self._start_shares = self._start_shares, None
        if shares is None:
            shares = [key for key, _ in sessions.scan(b"s" + r.SEP) if b"\x00$share/" in key]
        return since, owners, shares
