"""A durable session: state in the `sessions` database, messages read from Durable Storage.

While connected, the session reads each (subscription, stream) pair through a DS push
subscription, in batches of `durable_sessions.batch_size`. A batch is recorded (its read
window, its first sequence number and how it chose deliveries, from which a replay derives
which message got which sequence number; and the new read position) and that record is
written before any of its messages is sent (and fsynced when the subscription can receive
QoS 2; replicated, committed on a majority first only then: a QoS 1 record is sent once it
is on its way, and a node killed before its commit loses it with the read position it
carries, so the batch is read and delivered again, which QoS 1 allows); acknowledgements
are recorded as they arrive and a fully acknowledged batch record is deleted. So after any
restart the session knows exactly what was sent and not acknowledged: it resends those
with DUP and their original packet identifiers, sends PUBREL for QoS 2 deliveries whose
PUBREC it had, and reads on from the recorded position. Nothing is held in memory while
the client is offline.

Streams of one shard are read generation by generation, so messages of a topic arrive in
the order they were stored. A batch record is read back in batches.py; the session's part as
a member of durable shared-subscription groups is group_member.py.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Generator, Sequence

from broker.ds import TTV, Iterator, Stream, now_us
from broker.mqtt.constants import ReasonCode
from broker.mqtt.errors import MQTTError
from broker.mqtt.topic import parse_shared
from broker.session.durable import group_member as member
from broker.session.durable import records as r
from broker.session.durable.batches import Pending, completion_writes, offset_in, read_window
from broker.session.durable.context import DurableContext, message_from_ttv
from broker.session.durable.store import SessionStore, StoredSession, Write
from broker.session.durable.turn import run_in_slices
from broker.session.session import Delivery, Session, SubscriptionOptions

log = logging.getLogger(__name__)


async def _then(first: Awaitable[None], then: Callable[[], Awaitable[None]]) -> None:
    await first
    await then()


class DurableSession(Session):
    durable = True

    def __init__(self, client_id: str, expiry_interval: int, context: DurableContext) -> None:
        # No queue limit: the backlog lives in Durable Storage, and reading pauses while
        # what was fetched waits for the in-flight window.
        super().__init__(client_id, expiry_interval, 0, True)
        self._ctx = context
        self.since: dict[str, int] = {}
        # Per filter, so that unsubscribing one of many thousands touches only its own.
        self._positions: dict[str, dict[Stream, int | None]] = {}
        # Filters whose positions are still only in the store (`_positions_of`); None when
        # there are none, as in most sessions: an empty set costs 216 bytes.
        self._stored_positions: set[str] | None = None
        self._pending: dict[int, Pending] = {}
        # First sequence numbers of the batches acknowledged this turn: a dict as a set, as
        # empty it costs 64 bytes, not 216.
        self._dirty: dict[int, None] = {}
        self._flush_scheduled = False
        self._readers: dict[str, dict[Stream, asyncio.Task[None]]] = {}
        # Per shared subscription, the shards of its group this session reads (and whose
        # group positions `_positions` holds) while connected, with the tenure of its hold
        # on each (`group_member.sync_shards`).
        self._group_shards: dict[str, dict[int, int]] = {}
        # Looking for streams to read, every filter, in time slices (`refresh_streams`).
        self._refresh: asyncio.Task[None] | None = None
        self._refresh_again = False
        # Batches whose record is being written, oldest first: (write, batch, deliveries).
        # A list, not a deque: it holds a batch or two, and an empty deque costs ~600 bytes
        # in every one of possibly many thousands of offline sessions.
        self._recording: list[tuple[asyncio.Future[None], Pending | None, list[Delivery]]] = []
        self._unsent = 0
        # Shared subscriptions routed live, not a durable group's (`subscribe`): None, as
        # nearly every session has none (created only then, for the reason above).
        self._routed: set[str] | None = None
        # The last batch record being written when the session stopped reading a shard of
        # its groups: shards it is given are read once that is stored (`group_member.sync_shards`).
        self._settling: asyncio.Future[None] | None = None
        # Set while readers wait for the backlog to shrink (created only then, for the same
        # reason as above).
        self._room: asyncio.Future[None] | None = None
        self._next_seqno = 1
        # False for a session restored from disk at start-up until its client is back: then
        # what was in flight is rebuilt from the store, once.
        self.loaded = True
        self.protocol = 4  # MQTT version of the last connection, kept with the state
        self.disconnected_at: float | None = None
        self.epoch = 0  # ownership epoch of this node's hold on the session (ownership.py)
        # Started here, no meta of it applied here yet: the metas it writes create it
        # (ownership.py, SessionManager.meta_applied).
        self.created = True
        # A durable group member's window is full and nothing was acknowledged for a while
        # (groups.py); when the last acknowledgement came (monotonic seconds).
        self.stalled = False
        self.last_ack = 0.0

    # ---- state from the store ----------------------------------------------------------
    def restore_subscriptions(self, stored: StoredSession) -> None:
        groups = self._ctx.groups
        for key, (options, since) in stored.subscriptions.items():
            group = parse_shared(key)[0] if key.startswith("$share/") else None
            if group is not None:
                options.share_group = group
                if groups is not None:
                    since = groups.join(key, self.client_id, since)
            self.subscriptions[key] = options
            self.since[key] = since

    def attach(self, stored: StoredSession | None) -> None:
        """The client is back. After a restart (`stored` given) what was in flight is
        rebuilt from the store; within one run it is still in memory. Either way the
        connection resends the in-flight window with DUP, and reading resumes."""
        if stored is not None:
            plain = {key for key, options in self.subscriptions.items()
                     if options.share_group is None}
            self._stored_positions = plain or None
            self.awaiting_rel = set(stored.awaiting_rel)
            for record in stored.batches:
                self._replay(record, stored.released)
        self.loaded = True
        self.stalled = False
        self.last_ack = time.monotonic()
        self.refresh_streams()

    def _replay(self, record: r.BatchRecord, released: set[int]) -> None:
        options = self.subscriptions.get(record.topic_filter)
        pending = Pending(record, 0)
        done = set(record.done)
        first, count = record.first_seqno, record.count
        self._next_seqno = max(self._next_seqno, first + count)
        record.released = [seqno for seqno in released if first <= seqno < first + count]
        for offset, (ttv, qos) in enumerate(read_window(self._ctx, self.client_id, record)):
            if offset in done:
                continue
            seqno = first + offset
            retain = ttv.retain and (options.retain_as_published if options else False)
            ids = (options.identifier,) if options and options.identifier is not None else ()
            packet_id = r.packet_id_of(seqno)
            delivery = Delivery(message_from_ttv(ttv), qos, retain, ids, packet_id, pending)
            delivery.sent = True  # recorded, so perhaps received: DUP even when sent later
            window = self.connection.send_window if self.connection is not None else 0
            if seqno in released or len(self.inflight) < window:
                self.inflight[packet_id] = delivery
                if seqno in released:
                    self.awaiting_comp.add(packet_id)
            else:  # beyond the client's Receive Maximum: sent as the window opens
                self.queue.append(delivery)
            pending.remaining += 1
            self._ctx.stats.durable_replayed += 1
        if pending.remaining:
            self._pending[first] = pending
        else:  # all acknowledged, or the window's generation was dropped by retention
            self._ctx.store.write_soon(completion_writes(self.client_id, record), sync=False)

    def detach(self) -> None:
        """The client left: stop reading. What was fetched stays in memory for a resume
        within this run (a restart rebuilds it from the store)."""
        member.return_unsent(self)
        self._flush_acks()
        self.stop_reading()

    def writing(self) -> "asyncio.Future[None] | None":
        """The last batch record still being written, if any."""
        return self._recording[-1][0] if self._recording else None

    def unloadable(self) -> bool:
        """Whether all there is of the disconnected session is in the store, so that it can
        leave memory (SessionManager): no batch record being written, no shared subscription
        routed live (its deliveries wait in memory), nothing queued or in flight that no
        batch record holds (a retained message sent on subscribe)."""
        if self._recording or self._routed:
            return False
        return all(isinstance(delivery.batch, Pending)
                   for deliveries in (self.queue, self.inflight.values())
                   for delivery in deliveries)

    def stop_reading(self) -> None:
        for readers in self._readers.values():
            for task in readers.values():
                task.cancel()
        self._readers.clear()
        # Other members read on meanwhile: the group's positions are read again on resume.
        for key in self._group_shards:
            self._positions.pop(key, None)
        if self._group_shards:
            self._group_shards.clear()
            member.hold_gains(self)
        if self._refresh is not None:
            self._refresh.cancel()
            self._refresh = None
        self._open_room()

    def leave(self) -> None:
        """The session goes to another node: reading stops, and batches whose record is
        still being written are never sent from here (that node replays them)."""
        self.stop_reading()
        self._recording.clear()
        self._unsent = 0

    # ---- subscriptions -----------------------------------------------------------------
    def subscribe(self, key: str, options: SubscriptionOptions) -> bool:
        """A filter's messages are read from Durable Storage, from now on, and the filter is
        stored with the session; a shared subscription makes the session a member of its
        durable group (groups.py), which reads from where the group started. Only this
        filter's streams are looked up: a SUBSCRIBE of n filters costs n lookups, not one per
        filter the session has for each of them.

        Until every member of a replicated cluster runs code that fences a group's writes
        (versions.DURABLE_GROUPS), a shared subscription is routed live and not stored, as
        release 0.1.0 did, and stays so until it is unsubscribed."""
        groups = self._ctx.groups
        if options.share_group is not None and groups is not None and (
                self.is_routed(key) or (key not in self.since and not groups.allowed())):
            if self._routed is None:
                self._routed = set()
            self._routed.add(key)
            return super().subscribe(key, options)
        self.subscriptions[key] = options
        since = self.since.get(key)
        if since is None:
            since = now_us()
            if options.share_group is not None and groups is not None:
                since = groups.join(key, self.client_id, since)
            self.since[key] = since
        if self.connection is not None:
            self._start_readers(key)
        self._ctx.store.write_soon([(r.subscription_key(self.client_id, key),
                                     r.subscription_to_bytes(options, since))])
        return True

    def stored(self) -> Awaitable[None] | None:
        """The SUBACK of a durable subscription promises that a restart of every node keeps
        it (and the session it belongs to, written in an earlier turn, so committed first):
        it waits for this turn's commit, synced, and, replicated, for the nodes it reaches
        to apply it: each stores a message for it from then on (peer_applied.py)."""
        committed = self._ctx.store.write([], sync=True)
        seen = self._ctx.seen_everywhere
        return committed if seen is None else _then(committed, seen)

    def is_routed(self, key: str) -> bool:
        return self._routed is not None and key in self._routed

    def take_routed(self) -> list[str]:
        """The shared subscriptions routed live (made before the cluster allowed durable
        groups), no longer marked so: subscribed again, they join their durable groups."""
        routed, self._routed = sorted(self._routed or ()), None
        return routed

    def start_at(self, key: str, since: int) -> bool:
        """A subscription the session has already goes on from its position."""
        self.since.setdefault(key, since)
        return True

    def unsubscribe(self, key: str) -> bool:
        """Forgets the filter and what was read of it, in the store too. Positions in memory
        are all there are while the client is connected (a session restored at start-up
        loads them when its client comes back), so the store need not be scanned for them."""
        if self._routed is not None and key in self._routed:
            self._routed.discard(key)
            return super().unsubscribe(key)
        shared = self.subscriptions.pop(key).share_group is not None
        self.since.pop(key, None)
        for task in self._readers.pop(key, {}).values():
            task.cancel()
        writes: list[Write] = [(r.subscription_key(self.client_id, key), None)]
        if shared:  # the positions are the group's
            self._group_shards.pop(key, None)
            groups = self._ctx.groups
            if groups is not None:
                groups.leave(key, self.client_id)
        else:
            writes.extend((r.position_key(self.client_id, key, stream), None)
                          for stream in self._positions_of(key))
        self._positions.pop(key, None)
        self._ctx.store.write_soon(writes)
        return True

    # ---- reading -----------------------------------------------------------------------
    def refresh_streams(self) -> None:
        """Looks for streams to read for every filter (on resume, and when storage has new
        streams or generations), in time slices: a session with many thousands of filters
        must not stall the node while it does. A request while a pass runs starts another
        pass after it, since the pass may have looked at a filter before the change."""
        if self.connection is None:
            return
        if self._refresh is not None:
            self._refresh_again = True
            return
        self._refresh = run_in_slices(self._refresh_steps())

    def _refresh_steps(self) -> Generator[None, None, None]:
        again = True
        while again:
            self._refresh_again = False
            for topic_filter in list(self.subscriptions):
                if topic_filter in self.subscriptions:
                    self._start_readers(topic_filter)
                yield
            again = self._refresh_again
        self._refresh = None  # not reached when cancelled: `stop_reading` clears it then

    def _start_readers(self, topic_filter: str, shard: int | None = None) -> None:
        """Starts readers for the filter's streams not yet read (of one `shard`, when a
        reader of it finished): per shard only the oldest generation not read to its end,
        so a topic's messages stay in order across generations."""
        since = self.since.get(topic_filter)
        if since is None:
            return
        ds = self._ctx.ds
        read_filter = self._ctx.read_filter(topic_filter)
        if read_filter is None:  # a stream that does not exist (any more)
            return
        shared = topic_filter.startswith("$share/")
        groups = self._ctx.groups
        if shared and groups is not None:  # from the group's start (its first member's)
            since = groups.since(topic_filter) or since
        streams = ds.get_streams("messages", read_filter, since, shard)
        if shared:  # only the group's shards this session owns
            owned = member.sync_shards(self, topic_filter)
            streams = [stream for stream in streams if stream.shard in owned]
        if not streams:
            return
        positions = self._positions_of(topic_filter)
        streams = [stream for stream in streams if positions.get(stream, 0) is not None]
        oldest: dict[int, int] = {}
        for stream in streams:
            oldest[stream.shard] = min(oldest.get(stream.shard, stream.generation),
                                       stream.generation)
        readers = self._readers.get(topic_filter)
        for stream in streams:
            if stream.generation != oldest[stream.shard] or (readers and stream in readers):
                continue
            if readers is None:
                readers = self._readers[topic_filter] = {}
            position = positions.get(stream)
            iterator = (
                Iterator(stream, read_filter, position) if position is not None
                else ds.make_iterator(stream, read_filter, since)
            )
            readers[stream] = asyncio.get_running_loop().create_task(
                self._read(topic_filter, stream, iterator)
            )

    def _positions_of(self, topic_filter: str) -> dict[Stream, int | None]:
        """The filter's read positions. Those of a session restored at start-up are read
        from the store filter by filter, as its readers start, not all when it resumes."""
        positions = self._positions.get(topic_filter)
        stored = self._stored_positions
        if positions is None and stored is not None and topic_filter in stored:
            stored.discard(topic_filter)
            if not stored:
                self._stored_positions = None  # a set keeps its table when emptied
            positions = self._ctx.store.load_positions(self.client_id, topic_filter)
            if positions:
                self._positions[topic_filter] = positions
        return positions if positions is not None else {}

    async def _read(self, topic_filter: str, stream: Stream, iterator: Iterator) -> None:
        ctx = self._ctx
        subscription = ctx.ds.subscribe(iterator, ctx.batch_size)
        try:
            while True:
                after, ttvs = await subscription.next()
                while self._backlogged():
                    if self._room is None:
                        self._room = asyncio.get_running_loop().create_future()
                    await asyncio.shield(self._room)  # one reader cancelled, not all
                if self.connection is None or topic_filter not in self.subscriptions:
                    return
                self._record_batch(topic_filter, stream, iterator, after, ttvs)
                if after is None:
                    break
                iterator = after
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("durable session %s: reading %s failed", self.client_id, stream)
            if self.connection is not None:
                self.connection.fail(MQTTError("durable session read failed",
                                               ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR))
            return
        finally:
            subscription.close()
        readers = self._readers.get(topic_filter)
        if readers is not None:
            readers.pop(stream, None)
            if not readers:
                del self._readers[topic_filter]
        if self.connection is not None:
            self._start_readers(topic_filter, stream.shard)  # the shard's next generation

    def _record_batch(
        self, topic_filter: str, stream: Stream, before: Iterator, after: Iterator | None,
        ttvs: Sequence[TTV],
    ) -> None:
        """Assigns sequence numbers and starts writing the batch record; its messages are
        sent once the record is written (`_send_recorded`), in the order batches were
        recorded. Reading goes on meanwhile, so one fsync does not stall the stream."""
        options = self.subscriptions[topic_filter]
        ids = (options.identifier,) if options.identifier is not None else ()
        max_qos, as_published = options.qos, options.retain_as_published
        skip_from = self.client_id if options.no_local else None
        now = time.time()
        deliveries: list[Delivery] = []
        deliver = deliveries.append
        expired: list[int] = []  # offsets of deliveries that expired before they were sent
        first = self._next_seqno
        seqno = first
        end = 0
        # Filled in below, once the batch's extent is known; its deliveries carry it.
        pending = Pending(r.BatchRecord(topic_filter, stream, before.position, 0, first, 0,
                                         max_qos, options.no_local, expired), 0)
        for ttv in ttvs:  # per message: kept to lookups, this runs for every delivery
            if ttv.publisher == skip_from:
                continue
            message = message_from_ttv(ttv)
            qos = ttv.qos if ttv.qos < max_qos else max_qos
            live = message.expires_at is None or message.expires_at > now
            if not live:
                self._ctx.stats.drop("expired")
            if qos:  # takes a seqno even when expired, as a replay derives it
                if live:
                    deliver(Delivery(message, qos, ttv.retain and as_published, ids,
                                     r.packet_id_of(seqno), pending))
                else:
                    expired.append(seqno - first)  # counts as acknowledged
                seqno += 1
                end = ttv.timestamp
            elif live:
                deliver(Delivery(message, 0, ttv.retain and as_published, ids))
        self._next_seqno = seqno
        position = after.position if after is not None else None
        shared = options.share_group is not None
        writes = [SessionStore.group_position_write(
                      topic_filter, stream, position, self.client_id,
                      self._group_shards.get(topic_filter, {}).get(stream.shard, 0)) if shared
                  else SessionStore.position_write(self.client_id, topic_filter, stream, position)]
        count = seqno - first
        recorded: Pending | None = None
        if count > len(expired):
            # The window ends at the last delivery: all a replay needs to find them again.
            record = pending.record
            record.end, record.count = end, count
            writes.append((r.batch_key(self.client_id, first), record.to_bytes()))
            if expired:
                writes.append((r.acked_key(self.client_id, first),
                               r.acked_to_bytes(expired, count)))
            pending.remaining = count - len(expired)
            recorded = self._pending[first] = pending
        self._positions.setdefault(topic_filter, {})[stream] = position
        # Not awaited here: it completes even if this reader is cancelled. Exactly once
        # needs the identifier of every QoS 2 delivery to survive a power cut, so such a
        # record is fsynced first; a QoS 1 record a power cut took is only a batch read
        # and delivered again, which QoS 1 allows (a killed process loses neither).
        sync = max_qos == 2 or (shared and self._ctx.replicated)
        self._send_once_written(self._ctx.store.write(writes, sync), recorded, deliveries)

    def _send_once_written(self, written: "asyncio.Future[None]", recorded: "Pending | None",
                           deliveries: list[Delivery]) -> None:
        self._recording.append((written, recorded, deliveries))
        self._unsent += len(deliveries)
        self._update_room()
        written.add_done_callback(self._send_recorded)

    # ---- recorded batches go out -------------------------------------------------------
    def _send_recorded(self, _: object = None) -> None:
        recording = self._recording
        connection = self.connection
        while recording and recording[0][0].done():
            written, pending, deliveries = recording.pop(0)
            self._unsent -= len(deliveries)
            if written.cancelled() or written.exception() is not None:
                # Not recorded: nothing of it may be sent; it is read again after a restart.
                log.error("durable session %s: batch record not written: %r", self.client_id,
                          None if written.cancelled() else written.exception())
                if pending is not None:
                    self._pending.pop(pending.record.first_seqno, None)
                continue
            for delivery in deliveries:
                if connection is not None:
                    connection.deliver(delivery)
                elif delivery.qos:
                    self.queue.append(delivery)  # the client left meanwhile: sent on resume
        if connection is not None:
            connection.flush()
        self._update_room()

    def _backlogged(self) -> bool:
        return self.queued + self._unsent > 2 * self._ctx.batch_size

    def _update_room(self) -> None:
        if self._room is not None and not self._backlogged():
            self._open_room()

    def _open_room(self) -> None:
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)

    # ---- acknowledgements --------------------------------------------------------------
    def next_packet_id(self) -> int:
        """Deliveries outside a batch (retained messages) take a sequence number too, so
        their identifiers never collide with a batch's."""
        seqno = self._next_seqno
        self._next_seqno += 1
        return r.packet_id_of(seqno)

    def completed(self, delivery: Delivery) -> None:
        self.last_ack = time.monotonic()
        pending = delivery.batch
        if isinstance(pending, Pending):
            record = pending.record
            record.done.append(offset_in(record, delivery.packet_id))
            pending.remaining -= 1
            self._dirty[record.first_seqno] = None
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._ctx.store.before_flush(self._flush_acks)
        if self._room is not None:
            self._update_room()

    def released(self, packet_id: int) -> Awaitable[None] | None:
        """PUBREC: the PUBREL goes out only once this is on disk, so a restart resends
        PUBREL rather than the PUBLISH (which the client would take as a new message)."""
        super().released(packet_id)
        delivery = self.inflight.get(packet_id)
        pending = delivery.batch if delivery is not None else None
        if not isinstance(pending, Pending):
            return None
        record = pending.record
        seqno = record.first_seqno + offset_in(record, packet_id)
        record.released.append(seqno)
        return self._ctx.store.write([(r.released_key(self.client_id, seqno), b"1")])

    def _flush_acks(self) -> None:
        """Acknowledgements of one event-loop turn, written together."""
        self._flush_scheduled = False
        writes: list[Write] = []
        for first in self._dirty:
            pending = self._pending.get(first)
            if pending is None:
                continue
            if pending.remaining:
                record = pending.record
                writes.append((r.acked_key(self.client_id, first),
                               r.acked_to_bytes(record.done, record.count)))
            else:
                del self._pending[first]
                writes.extend(completion_writes(self.client_id, pending.record))
        self._dirty.clear()
        if writes:
            self._ctx.store.write_soon(writes, sync=False)

    # ---- incoming QoS 2 ----------------------------------------------------------------
    def rel_awaited(self, packet_id: int) -> Awaitable[None] | None:
        """The PUBREC must not leave before we remember owning the message: a restart would
        otherwise route the client's resent PUBLISH a second time."""
        super().rel_awaited(packet_id)
        return self._ctx.store.write([(r.awaiting_rel_key(self.client_id, packet_id), b"1")])

    def rel_arrived(self, packet_id: int) -> bool:
        if not super().rel_arrived(packet_id):
            return False
        self._ctx.store.write_soon([(r.awaiting_rel_key(self.client_id, packet_id), None)])
        return True

    def backlog(self) -> int:
        """Deliveries recorded but not yet acknowledged (the checkpoint lag)."""
        return sum(pending.remaining for pending in self._pending.values())

    # ---- as a member of durable groups ------------------------------------------------
    # What GroupManager asks of a member's session (groups.py), done in group_member.py.
    def returned_write(self, record: r.BatchRecord, unsent: bool) -> Write:
        return member.returned_write(self.client_id, record, unsent)

    def stop_shard(self, key: str, shard: int) -> list[asyncio.Future[None]]:
        return member.stop_shard(self, key, shard)

    def adopt_returned(self, key: str, shard: int,
                       among: Collection[bytes] | None = None) -> None:
        member.adopt_returned(self, key, shard, among)

    def stalled_since(self, now: float, timeout: float) -> bool:
        return member.stalled_since(self, now, timeout)

    def handed_back(self) -> list[tuple[r.BatchRecord, bool]]:
        return member.handed_back(self)
