"""Owns the sessions of this node: opening, takeover, expiry and delayed wills.

Timers live here (not in Session) so the session stays plain data. A will waits for
min(Will Delay Interval, Session Expiry Interval) after the connection is lost and is
cancelled when the client resumes the session in time (MQTT 5.0 section 3.1.3.2.2).

A durable session whose client left goes out of memory once what it was writing is
written (`offline`: its ID and its next deadline); it is loaded from the `sessions`
database again when its client comes back (`open`, or a takeover or the admin API asking
for it: `get`), or when its delayed will or its expiry is due (then its timers run as
they would have, and it leaves memory again if it is still there). Start-up loads none
of them: a pass over the stored metas, in time slices while clients are served, puts
each in `offline` or ends what expired while the node was down.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from broker.ds import StreamWrite
from broker.mqtt.constants import MAX_UINT32, PropertyId, ReasonCode
from broker.mqtt.packets import Will
from broker.session.durable import records
from broker.session.durable.offline import OfflineSessions
from broker.session.durable.orphans import expired_orphans
from broker.session.durable.ownership import sweep_writes
from broker.session.durable.session import DurableContext, DurableSession
from broker.session.durable.store import StoredSession
from broker.session.durable.turn import run_in_slices
from broker.session.message import Message, message_from_publish
from broker.session.session import Session

log = logging.getLogger(__name__)

NEVER_EXPIRES = MAX_UINT32
SWEEP_BATCH = 10_000
"""Tombstones one sweep command deletes at most: a Raft entry of a few hundred KB."""


def granted_expiry(requested: int, cap: float) -> int:
    """The Session Expiry Interval we grant: the client's, bounded by the admin cap if set
    (`mqtt.max_session_expiry_interval`, 0 = no bound)."""
    return min(requested, int(cap)) if cap else requested


class SessionManager:
    def __init__(
        self,
        publish: Callable[[Message], object],
        forget_subscriptions: Callable[[Session], None],
        max_queue: int,
        queue_qos0: bool,
        durable: DurableContext | None = None,
    ) -> None:
        self.sessions: dict[str, Session] = {}
        self._publish = publish
        self._forget_subscriptions = forget_subscriptions
        self._max_queue = max_queue
        self._queue_qos0 = queue_qos0
        self._durable = durable
        self._timers: dict[str, list[asyncio.TimerHandle]] = {}
        # Durable sessions out of memory, and the timer for the first of them due.
        self.offline = OfflineSessions()
        self._wake: asyncio.TimerHandle | None = None
        self._wake_at: int | None = None
        self._restoring: asyncio.Task[None] | None = None
        # When the node was last alive before this start (its last heartbeat): a session
        # stored as connected was lost then.
        self._lost_at: float | None = None
        self._known_streams: set[tuple[int, int, int]] = set()
        self._refreshing: asyncio.Task[None] | None = None
        self._refresh_again = False
        if durable is not None:
            durable.ds.change_listeners.append(self._streams_changed)

    def _streams_changed(
        self, shard: int, generation: int, streams: dict[int, StreamWrite] | None
    ) -> None:
        """A write to DS: if it created a stream (or a generation was sealed or dropped),
        connected durable sessions look for streams they should now read, a few sessions a
        time slice (1,000 connected members of a group cost a pass a second or more). A
        change while a pass runs starts another after it: the pass may have passed a
        session before the change."""
        if streams is not None:
            known = self._known_streams
            new = [key for key in ((shard, generation, s) for s in streams) if key not in known]
            if not new:
                return
            known.update(new)
        if self._refreshing is not None:
            self._refresh_again = True
            return
        self._refreshing = run_in_slices(self._refresh_steps())

    def _refresh_steps(self) -> Iterator[None]:
        again = True
        while again:
            self._refresh_again = False
            for session in list(self.sessions.values()):
                if isinstance(session, DurableSession) and session.connection is not None:
                    session.refresh_streams()
                    yield
            again = self._refresh_again
        self._refreshing = None

    def restore(self) -> None:
        """Start-up: the stored durable sessions stay on disk. A pass over their metas, in
        time slices (clients are served meanwhile: until it is done, a CONNECT looks for
        its session on disk), ends those that expired while the node was down (publishing
        their wills), publishes wills whose delay ran out, and puts the rest in `offline`
        until their client or their deadline comes. A session stored as connected counts
        as disconnected since the node's last heartbeat. The durable filter index is
        complete before this (node.py), so a will reaches every durable subscriber."""
        assert self._durable is not None
        self._lost_at = self._durable.store.last_heartbeat() or time.time()
        self.offline.complete = False
        self._restoring = run_in_slices(self._restore_steps())

    def _restore_steps(self) -> Iterator[None]:
        assert self._durable is not None
        store = self._durable.store
        now = time.time()
        found = 0
        for client_id, meta in store.stored_metas():
            if meta.site not in ("", store.site):
                continue  # another node's (replicated), loaded if its client comes here
            found += 1
            if client_id not in self.sessions and client_id not in self.offline:
                away = self._lost_at if meta.connected or meta.disconnected_at is None \
                    else meta.disconnected_at
                assert away is not None
                deadline = self._deadline(meta.expiry_interval, away, meta.will)
                if deadline is not None and deadline <= now:
                    self._wake_one(client_id)
                else:
                    self.offline.add(client_id, deadline)
            yield
        self.offline.complete = True
        self._restoring = None
        self._arm()
        log.info("%d durable sessions stored; %d of them out of memory until their clients"
                 " come back", found, len(self.offline))

    def _deadline(self, expiry: int, away_since: float, will: Will | None) -> float | None:
        """When a disconnected durable session must be looked at: its delayed will is due,
        or it expires (`durable_sessions.session_ttl` for one that never does)."""
        assert self._durable is not None
        times = []
        if will is not None:
            delay = will.properties.get(PropertyId.WILL_DELAY_INTERVAL, 0)
            times.append(away_since + min(delay, expiry))
        limit = self._durable.ttl if expiry == NEVER_EXPIRES else expiry
        if limit:
            times.append(away_since + limit)
        return min(times, default=None)

    def get(self, client_id: str) -> Session | None:
        """The ID's session held here; a durable one out of memory is loaded."""
        session = self.sessions.get(client_id)
        if session is None:
            loaded = self._load_offline(client_id)
            session = loaded[0] if loaded is not None else None
        return session

    def _load_offline(self, client_id: str) -> tuple[DurableSession, StoredSession] | None:
        """The ID's durable session, if this node holds it out of memory: loaded."""
        if self._durable is None or (client_id not in self.offline and self.offline.complete):
            return None
        self.offline.discard(client_id)
        return self._load_stored(client_id)

    def _load_stored(self, client_id: str) -> tuple[DurableSession, StoredSession] | None:
        """The ID's stored durable session, loaded (disconnected), with what was read of
        it; None when none is stored or another node claimed it."""
        assert self._durable is not None
        store = self._durable.store
        stored = store.load(client_id, subscriptions=True)
        if stored is None or stored.meta.site not in ("", store.site):
            return None
        session = self._stored(stored, self._lost_at or time.time())
        session.will = stored.meta.will
        return session, stored

    def _unload(self, session: DurableSession) -> None:
        """The durable session's client is gone: once what it writes is written, it leaves
        memory for `offline`, unless it holds something that is in memory only."""
        if self.sessions.get(session.client_id) is not session or session.connection is not None:
            return
        writing = session.writing()
        if writing is not None:
            writing.add_done_callback(lambda _: self._unload(session))
            return
        assert self._durable is not None and session.disconnected_at is not None
        if not session.unloadable() or (self._durable.replicated and session.created):
            return  # (replicated: once its first meta is applied, `meta_applied`)
        self._cancel_timers(session.client_id)
        del self.sessions[session.client_id]
        self.offline.add(session.client_id, self._deadline(
            session.expiry_interval, session.disconnected_at, session.will))
        self._arm()

    def _arm(self) -> None:
        """The timer for the first session of `offline` due."""
        due = self.offline.next_due()
        if due == self._wake_at:
            return
        if self._wake is not None:
            self._wake.cancel()
        self._wake, self._wake_at = None, due
        if due is not None:
            self._wake = asyncio.get_running_loop().call_later(max(0.0, due - time.time()),
                                                               self._woken)

    def _woken(self) -> None:
        self._wake = self._wake_at = None
        due = self.offline.due(time.time())
        self._arm()
        run_in_slices(self._wake_steps(due))

    def _wake_steps(self, due: list[str]) -> Iterator[None]:
        for client_id in due:
            if client_id not in self.sessions:  # (its client may be back meanwhile)
                self._wake_one(client_id)
            yield

    def _wake_one(self, client_id: str) -> None:
        """A session out of memory is due: loaded, its will and expiry run as the time since
        its client left says, and out of memory again if it is still there."""
        loaded = self._load_stored(client_id)
        if loaded is None:
            return
        session, stored = loaded
        assert session.disconnected_at is not None and self._durable is not None
        will = stored.meta.will
        elapsed = time.time() - session.disconnected_at
        if not self._start_timers(session, will, elapsed) and will is not None \
                and self.sessions.get(client_id) is session:
            self._save_meta(session, session.protocol, False, None)  # published: not twice
        ttl = self._durable.ttl
        if session.expiry_interval == NEVER_EXPIRES and ttl and elapsed >= ttl:
            self.end(session)  # (what `collect_garbage` does for those in memory)
        else:
            self._unload(session)

    def _stored(self, stored: StoredSession, lost_at: float) -> DurableSession:
        """A stored session in memory, disconnected, its in-flight state loaded once its
        client is back."""
        session = self._session_of(stored, lost_at)
        self.sessions[session.client_id] = session
        return session

    def _session_of(self, stored: StoredSession, lost_at: float) -> DurableSession:
        assert self._durable is not None
        meta = stored.meta
        session = DurableSession(stored.client_id, meta.expiry_interval, self._durable)
        session.restore_subscriptions(stored)
        session.loaded = False
        session.protocol = meta.protocol
        session.epoch = meta.epoch
        session.created = False
        session.disconnected_at = lost_at if meta.connected or meta.disconnected_at is None \
            else meta.disconnected_at
        return session

    def peek(self, client_id: str) -> Session | None:
        """The ID's session held here, to look at: one out of memory is read from disk and
        not kept (the admin API, a peer asking who holds the ID)."""
        session = self.sessions.get(client_id)
        if session is not None or self._durable is None or (
                client_id not in self.offline and self.offline.complete):
            return session
        stored = self._durable.store.load(client_id, subscriptions=True)
        if stored is None or stored.meta.site not in ("", self._durable.store.site):
            return None
        return self._session_of(stored, self._lost_at or time.time())

    def every(self) -> Iterator[Session]:
        """Every session held here (the admin API lists them): those in memory, then each
        one out of memory as read from disk, not kept."""
        yield from list(self.sessions.values())
        if self._durable is None:
            return
        store = self._durable.store
        for client_id in self.offline.ids():
            stored = store.load(client_id, subscriptions=True)
            if stored is not None and client_id not in self.sessions:
                yield self._session_of(stored, self._lost_at or time.time())

    async def claim(self, client_id: str) -> bool | None:
        """Replicated storage: makes this node the owner of the ID's stored durable session
        (its meta names this node with the next epoch; ownership.py), once the claim is
        committed and applied here. From then on every replica refuses what the node that
        held it writes, so the state read after the claim (`load`) is the last one that
        node could write. None: no session is stored; False: another node's claim came
        first."""
        assert self._durable is not None
        store = self._durable.store
        meta = store.meta(client_id)
        if meta is None:
            return None
        claim = replace(meta, site=store.site, epoch=meta.epoch + 1, created=False,
                        connected=False, will=None, disconnected_at=time.time())
        await store.write([(records.meta_key(client_id), claim.to_bytes())])
        now = store.meta(client_id)
        return now is not None and (now.site, now.epoch) == (claim.site, claim.epoch)

    def load(self, client_id: str) -> DurableSession | None:
        """A durable session this node claimed (`claim`), from its replica. Its will was
        the previous owner's to publish."""
        assert self._durable is not None
        stored = self._durable.store.load(client_id, subscriptions=True)
        if stored is None or stored.meta.site != self._durable.store.site:
            return None
        return self._stored(stored, time.time())

    def meta_applied(self, client_id: str, meta: records.Meta) -> None:
        """Replicated storage: a meta of the ID, from any node, was applied here. A session
        held here leaves if another node claimed it; once its own first meta is applied, its
        meta writes stop creating it (until then each one does: writes that wait for a
        commit merge, the last of a key wins, and the first must not lose its flag)."""
        session = self.sessions.get(client_id)
        if self._durable is None or meta.site != self._durable.store.site:
            self.offline.discard(client_id)
        if not isinstance(session, DurableSession):
            return
        if self._durable is None or meta.site != self._durable.store.site:
            self.claimed_elsewhere(client_id)
        elif meta.epoch == session.epoch and session.created:
            session.created = False
            if session.connection is None:
                self._unload(session)

    def claimed_elsewhere(self, client_id: str) -> None:
        """Another node's claim of a session held here was applied (this node was frozen or
        cut off while its client moved), or the replicas refused this node's writes of it,
        or those writes were not committed in time: the session and its connection, if any,
        leave this node (what they would still write the replicas refuse), and its client
        resumes it from what the replicas hold."""
        session = self.sessions.get(client_id)
        if not isinstance(session, DurableSession):
            return
        log.warning("durable session %s: the replicas did not take this node's writes of it"
                    " (another node claimed it, it ended while this node was cut off, or a"
                    " write was not committed): it leaves this node", client_id)
        if session.connection is not None:
            session.connection.take_over(ReasonCode.SESSION_TAKEN_OVER)
        self.release(session)

    def release(self, session: Session) -> None:
        """The durable session resumes on another node (replicated storage): it leaves
        this node's memory; its stored state stays, for that node to load."""
        if self.sessions.get(session.client_id) is not session:
            return
        self._cancel_timers(session.client_id)
        session.will = None
        del self.sessions[session.client_id]
        if isinstance(session, DurableSession):
            session.leave()

    def open(self, connection: Any, client_id: str, clean_start: bool, expiry: int) -> tuple[
        Session, bool
    ]:
        """Returns the session for a new connection and whether it was present before."""
        existing = self.sessions.get(client_id)
        stored = None
        if existing is None:
            loaded = self._load_offline(client_id)
            if loaded is not None:
                existing, stored = loaded
        # A new durable session's epoch is the wall clock (microseconds), and above the one
        # it replaces here: above every epoch an earlier session of the ID had, so a node
        # still holding one of those cannot pass its writes for a claim (ownership.py).
        epoch = max(existing.epoch + 1 if isinstance(existing, DurableSession) else 0,
                    int(time.time() * 1_000_000))
        if existing is not None and existing.connection is not None:
            existing.connection.take_over(ReasonCode.SESSION_TAKEN_OVER)
            # Taking over may have ended the old session (expiry 0): look it up again.
            existing = self.sessions.get(client_id)
        if existing is not None and clean_start:
            self.end(existing)
            existing = None
        self._cancel_timers(client_id)
        if existing is None:
            session: Session
            if self._durable is not None and expiry > 0:
                session = DurableSession(client_id, expiry, self._durable)
                session.epoch = epoch
            else:
                session = Session(client_id, expiry, self._max_queue, self._queue_qos0)
            self.sessions[client_id] = session
        else:
            session = existing
            session.expiry_interval = expiry
            session.will = None
        session.connection = connection
        if isinstance(session, DurableSession):
            assert self._durable is not None
            store = self._durable.store
            if stored is None and not session.loaded:
                stored = store.load(client_id)
            session.attach(stored)
            self._save_meta(session, connection.version, True, connection.will)
            self._member_changed(session)
        return session, existing is not None

    def stall_changed(self, session: DurableSession) -> None:
        """A durable group member stalled or recovered: its meta says so, for the node that
        decides its groups."""
        connection = session.connection
        if connection is not None:
            self._save_meta(session, connection.version, True, connection.will)

    def _member_changed(self, session: DurableSession) -> None:
        groups = self._durable.groups if self._durable is not None else None
        if groups is not None:
            groups.member_changed(session)

    def detach(self, session: Session, will: Will | None) -> None:
        """The connection is gone: publish or schedule the will, then keep or end the session."""
        version = session.connection.version if session.connection is not None else 4
        session.connection = None
        if isinstance(session, DurableSession):
            session.detach()
            session.disconnected_at = time.time()
        if not self._start_timers(session, will, 0.0):
            will = None  # published already, or there is none
        if isinstance(session, DurableSession) and session.expiry_interval:
            self._save_meta(session, version, False, will)
            self._member_changed(session)
            # Not at once: a takeover detaches the session only to attach it again.
            asyncio.get_running_loop().call_soon(self._unload, session)

    def _start_timers(self, session: Session, will: Will | None, elapsed: float) -> bool:
        """Will and expiry timers for a session disconnected `elapsed` seconds ago; False
        when the will was published right away."""
        delay = will.properties.get(PropertyId.WILL_DELAY_INTERVAL, 0) if will else 0
        expiry = session.expiry_interval
        pending = will is not None
        if will is not None and (delay == 0 or expiry == 0 or min(delay, expiry) <= elapsed):
            session.will = None
            self._publish_will(session.client_id, will)
            pending = False
        elif will is not None:
            session.will = will
            self._schedule(session.client_id, min(delay, expiry) - elapsed, self._fire_will,
                           session)
        if expiry == 0 or (expiry != NEVER_EXPIRES and expiry <= elapsed):
            self.end(session)
        elif expiry != NEVER_EXPIRES:
            self._schedule(session.client_id, expiry - elapsed, self.end, session)
        return pending

    def _save_meta(self, session: DurableSession, version: int, connected: bool,
                   will: Will | None) -> None:
        assert self._durable is not None
        session.protocol = version
        meta = records.Meta(session.expiry_interval, version, connected,
                            None if connected else session.disconnected_at or time.time(), will,
                            self._durable.store.site, session.epoch, session.created,
                            connected and session.stalled)
        self._durable.store.write_soon([(records.meta_key(session.client_id), meta.to_bytes())])

    def collect_garbage(self, now: float | None = None) -> int:
        """Ends disconnected durable sessions past their expiry, or past
        `durable_sessions.session_ttl` for those that never expire; returns how many."""
        if self._durable is None:
            return 0
        now = time.time() if now is None else now
        ended = 0
        for session in list(self.sessions.values()):
            if (not isinstance(session, DurableSession) or session.connection is not None
                    or session.disconnected_at is None):
                continue
            expiry = session.expiry_interval
            limit = self._durable.ttl if expiry == NEVER_EXPIRES else expiry
            if limit and now - session.disconnected_at >= limit:
                self.end(session)
                ended += 1
        return ended

    async def collect_orphans(self, is_up: Callable[[str], bool]) -> int:
        """Replicated storage, on the `sessions` group's leader: ends the stored sessions of
        nodes that are not up that expired (orphans.py), each by claiming it and deleting it;
        returns how many. A session claimed meanwhile by a node its client came back to
        stays (the claim here is refused)."""
        assert self._durable is not None
        store = self._durable.store
        expired = expired_orphans(store.metas(), store.heartbeats().get, is_up, time.time(),
                                  self._durable.ttl)
        ended = 0
        for client_id in expired:
            ended += await self.discard_stored(client_id)
        return ended

    async def sweep_tombstones(self, older_than: float, now: float | None = None) -> int:
        """Replicated storage, on the `sessions` group's leader: the replicas forget the
        epochs of sessions that ended more than `older_than` seconds ago (ownership.py),
        at most SWEEP_BATCH a command; returns how many."""
        assert self._durable is not None
        store = self._durable.store
        cutoff = int(((time.time() if now is None else now) - older_than) * 1_000_000)
        tombstones = store.tombstones()
        swept = 0
        for start in range(0, len(tombstones), SWEEP_BATCH):
            writes = sweep_writes(tombstones[start:start + SWEEP_BATCH], cutoff)
            if writes:
                await store.write(writes)
                swept += len(writes) - 1  # the cutoff is not a tombstone
        self._durable.stats.tombstones_swept += swept
        return swept

    async def discard_stored(self, client_id: str) -> bool:
        """Replicated storage: ends a stored session this node does not hold (its node is
        down), by claiming it and deleting it; False when another node's claim came first
        (its client is back there) or nothing is stored."""
        assert self._durable is not None
        store = self._durable.store
        if client_id in self.sessions or not await self.claim(client_id):
            return False
        await store.write(store.delete_writes(client_id))
        return True

    def end(self, session: Session) -> None:
        """The session is over: a pending will goes out now, state is dropped."""
        if self.sessions.get(session.client_id) is not session:
            return
        self._cancel_timers(session.client_id)
        if session.will is not None:
            self._publish_will(session.client_id, session.will)
            session.will = None
        del self.sessions[session.client_id]
        returned = []
        if isinstance(session, DurableSession):
            assert self._durable is not None
            session.stop_reading()
            if self._durable.groups is not None:
                returned = self._durable.groups.session_ended(session)
        self._forget_subscriptions(session)
        if isinstance(session, DurableSession):
            assert self._durable is not None
            store = self._durable.store
            store.write_soon([*store.delete_writes(session.client_id), *returned])

    def hand_over(self, session: Session) -> None:
        """The session moved to another node (a takeover there): it leaves this node with
        no will (the client resumed it) and nothing counted as dropped (its queue moved)."""
        if self.sessions.get(session.client_id) is not session:
            return
        session.will = None
        session.queue.clear()
        session.inflight.clear()
        self.end(session)

    def close_all(self) -> None:
        for client_id in list(self._timers):
            self._cancel_timers(client_id)
        if self._wake is not None:
            self._wake.cancel()
        if self._restoring is not None:
            self._restoring.cancel()

    def _fire_will(self, session: Session) -> None:
        if session.will is not None and session.connection is None:
            will, session.will = session.will, None
            self._publish_will(session.client_id, will)
            if isinstance(session, DurableSession):
                self._save_meta(session, session.protocol, False, None)  # never fired twice

    def _publish_will(self, client_id: str, will: Will) -> None:
        properties = {
            k: v for k, v in will.properties.items() if k != PropertyId.WILL_DELAY_INTERVAL
        }
        self._publish(message_from_publish(
            will.topic, will.payload, will.qos, will.retain, client_id, properties
        ))

    def _schedule(self, client_id: str, delay: float, callback: Callable[[Session], None],
                  session: Session) -> None:
        handle = asyncio.get_running_loop().call_later(delay, callback, session)
        self._timers.setdefault(client_id, []).append(handle)

    def _cancel_timers(self, client_id: str) -> None:
        for handle in self._timers.pop(client_id, ()):
            handle.cancel()
