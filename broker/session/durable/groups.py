"""Durable shared-subscription groups: `$share/<group>/<filter>` of durable sessions.

A group is a consumer of Durable Storage like a durable session: messages matching its
filter are stored once while it exists, and it reads them from where it started, each
message to one member. The work is split by shard (group_records.py): each shard of the
messages database is read, for the group, by one connected member at a time, from the
group's position in it, through that member's session, which records what it sent as it
records its own batches. So a member's connection that breaks keeps what it had in flight,
resent when it comes back (MQTT-4.8.2-4), while its shards go to the members still
connected; a member whose session ends leaves its QoS 1 deliveries unacknowledged to the
shard's next owner and drops its QoS 2 ones (MQTT-4.8.2-5).

One node decides the assignment (group_assign.py): the node itself with `builtin_local`,
the leader of the replicated `sessions` group with `builtin_raft`, from its replica, in
changes that name the state they replace, so a deposed leader's decision is refused
(group_fencing.py). Every node acts on the owner records as they are applied: a member
served here starts reading a shard given to it, or stops reading a shard it is asked to
let go of and frees it once its batch records are stored.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from broker.ds import DurableStorage
from broker.session.durable import group_records as g
from broker.session.durable import records as r
from broker.session.durable.group_assign import rebalance
from broker.session.durable.session import DurableSession
from broker.session.durable.store import SessionStore, Write
from broker.session.durable.turn import TimeSlice
from broker.session.session import Session
from broker.stats import Stats

log = logging.getLogger(__name__)

READY, STALLED, GONE = "ready", "stalled", "gone"


class Group:
    """(A plain class: a dataclass costs a start ~0.5 ms to build, issue 42.)"""

    __slots__ = ("live", "members", "owners", "since", "touched")

    def __init__(self, since: int, members: set[str], owners: dict[int, g.Owner]) -> None:
        self.since = since
        self.members = members
        self.owners = owners
        # The connected members' states as last decided (None: every member to be looked
        # at), and the members whose state may have changed since (`GroupManager.changed`).
        self.live: dict[str, str] | None = None
        self.touched: set[str] = set()


class GroupManager:
    def __init__(self, ds: DurableStorage, store: SessionStore, stats: Stats,
                 sessions: Mapping[str, Session], state: Callable[[str], str],
                 replicated: bool, ack_timeout: float = 0.0) -> None:
        self._store = store
        self._stats = stats
        self._sessions = sessions
        # A member's client, on any node: READY, STALLED (connected, window full and
        # unacknowledged) or GONE.
        self.state = state
        self._ack_timeout = ack_timeout
        # Set by the node: writes a member's stalled flag into its session's meta.
        self.stall_changed: Callable[[DurableSession], None] = lambda session: None
        # builtin_raft: resolves True once this node's replica of `sessions` holds all that
        # was committed before the call (a barrier through the log).
        self.read_barrier: Callable[[], Awaitable[bool]] | None = None
        # builtin_raft: shards given to a member served here that it may read, (share,
        # shard) -> (member, the epoch of its session here): given, and a barrier passed
        # since, while the session was here (`readable`).
        self._readable: dict[tuple[str, int], tuple[str, int]] = {}
        self._unchecked: set[tuple[str, int, str, int]] = set()
        self._barrier: asyncio.Task[None] | None = None
        # builtin_raft: resolves True once this node's replica of the messages shard holds
        # all that was committed in it before the call (a barrier through its log).
        self.shard_barrier: Callable[[int], Awaitable[bool]] | None = None
        # Shards whose handed-back batches wait for such a barrier before their owner takes
        # them (`_offer`), and whether more came back meanwhile (another barrier then).
        self._offering: dict[tuple[str, int], bool] = {}
        self.replicated = replicated
        self.n_shards = ds.messages.n_shards
        self.groups: dict[str, Group] = {}
        # Set by the app with builtin_raft: whether this node decides (leads `sessions`).
        self.decides: Callable[[], bool] = lambda: True
        # Set by the app with builtin_raft: whether sessions may join groups now (every
        # member's code fences a group's writes: broker/cluster/versions.py).
        self.allowed: Callable[[], bool] = lambda: True
        # Set by the app with builtin_raft: a wait for `allowed` when it is about to be (a
        # fresh cluster's first moments: every member's code fences, the cluster's version
        # rises at the metadata leader's next round), None when it is, or will not be soon.
        self.allowed_soon: Callable[[], Awaitable[bool] | None] = lambda: None
        self._dirty: set[str] = set()
        self._pass: asyncio.Handle | None = None
        self._releasing: set[tuple[str, int]] = set()
        # Shards asked back from a member (`revoke`), freed by its node: asked again every
        # tick while so, if that node's first try failed.
        self._revoked: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- what is stored ----------------------------------------------------------------
    def load(self) -> None:
        """Every group, as this node's store holds them (start-up, a snapshot applied)."""
        since, owners, shares = self._store.groups()
        self.groups = {}
        for key in shares:
            _, client_id = r.split_key(key)
            share = key[len(r.prefix(b"s", client_id)):].decode()
            self._group(share, since.get(share, 0)).members.add(client_id)
        for share, start in since.items():
            self._group(share, start)
        for share, shard_owners in owners.items():
            self._group(share, since.get(share, 0)).owners.update(shard_owners)
        self._readable.clear()
        self._revoked = {(share, shard) for share, shard_owners in owners.items()
                         for shard, owner in shard_owners.items() if owner.state == g.REVOKE}
        self._dirty.update(self.groups)
        self._schedule()
        # A snapshot applied: the owner changes it holds were never applied one by one here,
        # so the members served here look at their shards again (each read once a barrier
        # passed, from the positions then: `readable`), and take what was handed back.
        for share, group in self.groups.items():
            for client_id in group.members:
                self._refresh(client_id, share)

    def _group(self, share: str, since: int) -> Group:
        group = self.groups.get(share)
        if group is None:
            group = self.groups[share] = Group(since, set(), {})
        elif since and not group.since:
            group.since = since
        return group

    # ---- members -----------------------------------------------------------------------
    def join(self, share: str, client_id: str, since: int) -> int:
        """A session subscribes to the share (or is restored with it); returns where the
        group reads from: its start, set by its first member."""
        group = self.groups.get(share)
        if group is None or not group.since:
            group = self._group(share, since)
            self._store.write_soon([(g.group_key(share), g.group_to_bytes(group.since))])
        group.members.add(client_id)
        self.changed(share, client_id)
        return group.since

    def leave(self, share: str, client_id: str) -> None:
        group = self.groups.get(share)
        if group is not None:
            group.members.discard(client_id)
            self.changed(share, client_id)

    def member_changed(self, session: Session) -> None:
        """A member connected, disconnected or ended: its groups may need a new spread."""
        for key, options in session.subscriptions.items():
            if options.share_group is not None:
                self.changed(key, session.client_id)

    def session_ended(self, session: DurableSession) -> list[Write]:
        """The writes that hand what a member's session left unacknowledged in its groups to
        their next readers (with the session's own deletes)."""
        handed = session.handed_back()
        writes = [session.returned_write(record, unsent) for record, unsent in handed]
        self.returned({(record.topic_filter, record.stream.shard) for record, _ in handed})
        for key, options in session.subscriptions.items():
            if options.share_group is not None:
                self.leave(key, session.client_id)
        return writes

    def joining_soon(self, session: Session) -> Awaitable[bool] | None:
        """`allowed_soon` for a session about to subscribe to a share: a durable one joins
        its group (a memory session's share is routed live whatever the version)."""
        return self.allowed_soon() if isinstance(session, DurableSession) else None

    def since(self, share: str) -> int | None:
        group = self.groups.get(share)
        return group.since if group is not None and group.since else None

    def assigned(self, share: str, client_id: str) -> set[int]:
        """The shards given to the member (`own`)."""
        group = self.groups.get(share)
        if group is None:
            return set()
        return {shard for shard, owner in group.owners.items()
                if owner.client == client_id and owner.state == g.OWN}

    def readable(self, share: str, session: DurableSession) -> set[int]:
        """The shards the member, served here, reads. With builtin_raft, a shard given to it
        only once a barrier passed after it was, while its session is here (its epoch): this
        node's replica may lag behind the log (it was down, or slow, or the session was
        elsewhere meanwhile), and an owner record it applied be superseded, or the group's
        positions in the shard be behind what the shard's last reader recorded; read from
        there, the member would read again what it or another one did."""
        client_id = session.client_id
        shards = self.assigned(share, client_id)
        if self.read_barrier is None:
            return shards
        checked = (client_id, session.epoch)
        readable = {shard for shard in shards if self._readable.get((share, shard)) == checked}
        if len(readable) < len(shards):
            self._unchecked.update((share, shard, client_id, session.epoch)
                                   for shard in shards - readable)
            if self._barrier is None:
                self._barrier = asyncio.get_running_loop().create_task(self._check())
        return readable

    async def _check(self) -> None:
        """Passes barriers until every shard given to a member served here is checked."""
        assert self.read_barrier is not None
        try:
            while self._unchecked:
                checking, self._unchecked = self._unchecked, set()
                if not await self.read_barrier():
                    self._unchecked |= checking  # cut off from the majority: later
                    await asyncio.sleep(1.0)
                    continue
                for share, shard, client_id, epoch in checking:
                    group = self.groups.get(share)
                    session = self._sessions.get(client_id)
                    if (group is not None and isinstance(session, DurableSession)
                            and session.epoch == epoch
                            and group.owners.get(shard) == g.Owner(client_id, g.OWN)):
                        self._readable[(share, shard)] = (client_id, epoch)
                        self._refresh(client_id, share)
        finally:
            self._barrier = None

    # ---- deciding ----------------------------------------------------------------------
    def changed(self, share: str, client_id: str | None = None) -> None:
        """The group is to be decided again: its owners changed, or the state of a member
        (`client_id`)."""
        group = self.groups.get(share)
        if client_id is not None and group is not None:
            group.touched.add(client_id)
        self._dirty.add(share)
        self._schedule()

    def tick(self, now: float | None = None) -> None:
        """Periodic: members served here that stalled or recovered; with builtin_raft every
        group again (a member's node may have gone down, or this node may have become the
        one that decides)."""
        self._check_stalls(time.monotonic() if now is None else now)
        for share, shard in list(self._revoked):
            owner = self.groups[share].owners[shard] if share in self.groups else None
            session = self._sessions.get(owner.client) if owner and owner.client else None
            if owner is not None and isinstance(session, DurableSession):
                self._release(session, share, shard, owner)
        if self.replicated:
            for group in self.groups.values():
                group.live = None  # a member's node may have gone down: look at each
            self._dirty.update(self.groups)
            self._schedule()

    def _check_stalls(self, now: float) -> None:
        if not self._ack_timeout:
            return
        for share, group in self.groups.items():
            for client_id in group.members:
                session = self._sessions.get(client_id)
                if not isinstance(session, DurableSession):
                    continue
                stalled = session.stalled_since(now, self._ack_timeout)
                if stalled != session.stalled:
                    session.stalled = stalled
                    log.info("durable group %s: member %s %s", share, client_id,
                             "stalled: its shards go to the others" if stalled else
                             "acknowledges again")
                    self.stall_changed(session)
                    self.member_changed(session)

    def _schedule(self) -> None:
        if self._pass is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # start-up before the loop runs: `tick` comes
            self._pass = loop.call_soon(self._decide)

    def _decide(self) -> None:
        self._pass = None
        dirty, self._dirty = self._dirty, set()
        if not self.decides():
            return
        budget = TimeSlice()
        shares = list(dirty)
        for n, share in enumerate(shares):
            if budget.spent():  # every group again (a tick with 10,000): the rest later
                self._dirty.update(shares[n:])
                self._schedule()
                return
            group = self.groups.get(share)
            if group is None:
                continue
            if not group.members:
                self._end(share)
                continue
            live = self._live(group)
            ready = {m for m, state in live.items() if state == READY}
            stalled = {m for m, state in live.items() if state == STALLED}
            for shard, stored, new in rebalance(self.n_shards, group.owners, ready, stalled):
                self._write_owner(share, shard, stored, new)

    def _live(self, group: Group) -> dict[str, str]:
        """The group's connected members by state: every member looked at once, then only
        those whose state may have changed since (a group of 10,000 members is decided
        again each time one of them comes or goes)."""
        live = group.live
        looked_at = group.touched
        if live is None:
            live = group.live = {}
            looked_at = group.members
        for member in looked_at:
            state = self.state(member) if member in group.members else GONE
            if state == GONE:
                live.pop(member, None)
            else:
                live[member] = state
        group.touched = set()
        return live

    def _write_owner(self, share: str, shard: int, stored: g.Owner | None,
                     new: g.Owner) -> "asyncio.Future[None]":
        tenure = (self._store.owner_tenure(share, shard)
                  if stored is not None and stored.client == new.client else
                  g.unique_id() if new.client is not None else 0)
        written = self._store.write([(g.owner_key(share, shard), new.to_bytes(stored, tenure))])
        if not self.replicated:  # applied at once: act on it here
            self.owner_applied(share, shard, new)
        return written

    def _end(self, share: str) -> None:
        """The last member's session ended or unsubscribed: the group and its positions go."""
        log.info("durable group %s ended: no member left", share)
        del self.groups[share]
        self._revoked = {(s, shard) for s, shard in self._revoked if s != share}
        self._readable = {key: client for key, client in self._readable.items()
                          if key[0] != share}
        self._store.write_soon([(key, None) for key in self._store.group_keys(share)])

    # ---- acting on what is stored ------------------------------------------------------
    def applied(self, writes: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Replicated: writes to the `sessions` database, from any node, applied here."""
        for key, value in writes:
            kind, name = r.split_key(key)
            if kind == b"s" and b"\x00$share/" in key:
                share = key[len(r.prefix(b"s", name)):].decode()
                if value is None:
                    self.leave(share, name)
                else:
                    self._group(share, 0).members.add(name)
                    self.changed(share, name)
            elif kind == b"m":
                session = self._sessions.get(name)
                if session is not None:
                    self.member_changed(session)
                else:
                    self._members_of(name)
            elif kind == b"g" and value is not None:
                self._group(name, 0).since = g.group_since(value)
            elif kind == b"g":
                self.groups.pop(name, None)
            elif kind == b"o" and value is not None:
                self.owner_applied(name, g.shard_of_key(key), g.Owner.from_bytes(value))
            elif kind == b"x" and value is not None:
                self.offer_returned(name, g.returned_shard(key, name))

    def _members_of(self, client_id: str) -> None:
        """A meta of a session not served here: the groups it is a member of may change."""
        for share, group in self.groups.items():
            if client_id in group.members:
                self.changed(share, client_id)

    def owner_applied(self, share: str, shard: int, owner: g.Owner) -> None:
        group = self._group(share, 0)
        before = group.owners.get(shard)
        group.owners[shard] = owner
        if self._readable.get((share, shard), (owner.client, 0))[0] != owner.client or \
                owner.state != g.OWN:
            self._readable.pop((share, shard), None)
        if owner.state == g.REVOKE:
            self._revoked.add((share, shard))
        else:
            self._revoked.discard((share, shard))
        if before is not None and before.client not in (None, owner.client):
            # Taken from it (its client left, or its node was thought down): it stops reading
            # the shard now, so that it reads it again, if it comes back to it, from the
            # group's position then, not from where it was.
            session = self._sessions.get(before.client)
            if isinstance(session, DurableSession):
                session.stop_shard(share, shard)
        if owner.client is None:
            self.changed(share)  # free: to be handed out
        elif owner.state == g.REVOKE:
            session = self._sessions.get(owner.client)
            if isinstance(session, DurableSession):
                self._release(session, share, shard, owner)
        else:
            self._refresh(owner.client, share)  # it takes what waits in the shard, too

    def _refresh(self, client_id: str, share: str) -> None:
        session = self._sessions.get(client_id)
        if isinstance(session, DurableSession) and session.connection is not None:
            session.refresh_streams()

    def returned(self, shares: set[tuple[str, int]]) -> None:
        """Batches were returned to these shards here (`builtin_local`: no write comes back
        applied): their readers take them once written, after this turn."""
        if not self.replicated:
            loop = asyncio.get_running_loop()
            for share, shard in shares:
                loop.call_soon(self.offer_returned, share, shard)

    def offer_returned(self, share: str, shard: int) -> None:
        """Batches members handed back wait in the shard: its owner takes them, if it is
        served here. With builtin_raft, once this node's replica of the messages shard holds
        what they name (`_offer`): a batch was read on the node of the member that handed
        it back, whose replica may be ahead of this one (a link to the shard's leader cut,
        this node catching up), and a window read back short loses what it misses."""
        session = self._taker(share, shard)
        if session is None:
            return
        if self.shard_barrier is None:
            session.adopt_returned(share, shard)
            return
        offering = (share, shard)
        if offering in self._offering:
            self._offering[offering] = True  # after the barrier under way: another one
            return
        self._offering[offering] = False
        task = asyncio.get_running_loop().create_task(self._offer(share, shard))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _offer(self, share: str, shard: int) -> None:
        """Passes a barrier through the shard's log, then has its owner take the batches
        handed back before the barrier was proposed: the messages they name were committed
        before they were handed back, so this node's replica holds them then. Again while
        more come back."""
        assert self.shard_barrier is not None
        offering = (share, shard)
        try:
            while True:
                self._offering[offering] = False
                waiting = {key for key, _ in self._store.load_returned(share, shard)}
                if not waiting:
                    return  # (all taken: the offer of a take just written, say)
                if not await self.shard_barrier(shard):
                    if self._taker(share, shard) is None:
                        return  # its next owner offers them again
                    await asyncio.sleep(1.0)  # cut off from the shard's majority: later
                    continue
                session = self._taker(share, shard)
                if session is None:
                    return
                session.adopt_returned(share, shard, waiting)
                if not self._offering[offering]:
                    return
        finally:
            del self._offering[offering]

    def _taker(self, share: str, shard: int) -> DurableSession | None:
        """The shard's owner, if it is served here, connected, and (builtin_raft) checked."""
        group = self.groups.get(share)
        owner = group.owners.get(shard) if group is not None else None
        if owner is None or owner.client is None or owner.state != g.OWN:
            return None
        session = self._sessions.get(owner.client)
        if not isinstance(session, DurableSession) or session.connection is None:
            return None
        if self.read_barrier is not None and \
                self._readable.get((share, shard)) != (owner.client, session.epoch):
            return None  # taken once the shard is checked (`readable`)
        return session

    def _release(self, session: DurableSession, share: str, shard: int,
                 owner: g.Owner) -> None:
        """Asked to let go of a shard: stop reading it, let its batch records be stored,
        then free it."""
        if (share, shard) in self._releasing:
            return
        self._releasing.add((share, shard))
        recording = session.stop_shard(share, shard)

        async def release() -> None:
            try:
                await asyncio.gather(*recording, return_exceptions=True)
                group = self.groups.get(share)
                if group is None or group.owners.get(shard) != owner:
                    return  # it moved meanwhile (its member left)
                # Done with once the change is made: the shard may come back to this member
                # and be asked back before the change is stored.
                written = self._write_owner(share, shard, owner, g.Owner(None, g.FREE))
            finally:
                self._releasing.discard((share, shard))
            try:
                await written
            except Exception:  # refused or not committed: asked again while still `revoke`
                log.exception("durable group %s: freeing shard %d failed", share, shard)

        task = asyncio.get_running_loop().create_task(release())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        if self._pass is not None:
            self._pass.cancel()
        for task in self._tasks:
            task.cancel()
        if self._barrier is not None:
            self._barrier.cancel()
