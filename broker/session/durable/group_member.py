"""A durable session as a member of durable shared-subscription groups (groups.py): the
shards of a group it reads, what it hands back to the group, and what it takes over that
other members handed back.

These functions are DurableSession's own (session.py), kept apart from its reading and
acknowledging: they work on its state, as its methods did, and the session calls them.
"""

import asyncio
from collections.abc import Collection
from functools import partial
from typing import TYPE_CHECKING

from broker.session.durable import group_records as g
from broker.session.durable import records as r
from broker.session.durable.batches import Pending, offset_in, read_window
from broker.session.durable.context import message_from_ttv
from broker.session.durable.store import Write
from broker.session.session import Delivery

if TYPE_CHECKING:
    from broker.session.durable.session import DurableSession


def return_unsent(session: "DurableSession", key: str | None = None,
                  shard: int | None = None) -> None:
    """A group member's client left (or it let go of the share's shard): what was read
    for its shared subscriptions (that shard's) and never sent goes back to the group,
    for the shard's next reader, rather than wait for it: it holds back only what was
    on the wire (MQTT-4.8.2-4). Each batch's returned part is written with the member's
    record of it as done, in the same commit."""
    groups = session._ctx.groups
    if groups is None:
        return
    taken = take_unsent(session, key, shard)
    if not taken:
        return
    for returned in taken:
        session._dirty[returned.first_seqno] = None
    session._ctx.store.write_soon([returned_write(session.client_id, returned, True)
                                   for returned in taken])
    session._flush_acks()
    groups.returned({(returned.topic_filter, returned.stream.shard) for returned in taken})


def take_unsent(session: "DurableSession", key: str | None = None, shard: int | None = None
                ) -> list[r.BatchRecord]:
    """Takes the deliveries of shared subscriptions (of `key`'s `shard`) that wait in
    the queue never sent out of it and marks them done in their batches: per batch, the
    part handed back (a copy of the record whose `done` is all the rest).

    What waits in the queue, and what waits for its batch's record to be written: should
    that record be refused (replicated: the shard moved meanwhile), its deliveries are
    the group's already, and the replicas refuse the handing back too (group_fencing.py)."""
    taken: dict[int, tuple[Pending, list[int]]] = {}

    def take(delivery: Delivery) -> bool:
        pending = delivery.batch
        if (delivery.sent or not isinstance(pending, Pending)
                or not pending.record.topic_filter.startswith("$share/")):
            return False
        record = pending.record
        if key is not None and (record.topic_filter != key or record.stream.shard != shard):
            return False
        offsets = taken.setdefault(record.first_seqno, (pending, []))[1]
        offsets.append(offset_in(record, delivery.packet_id))
        return True

    if session.queued:
        kept = [delivery for delivery in session.queue if not take(delivery)]
        session.queue.clear()
        session.queue.extend(kept)
    for _, _, deliveries in session._recording:
        kept = [delivery for delivery in deliveries if not take(delivery)]
        session._unsent -= len(deliveries) - len(kept)
        deliveries[:] = kept
    returned: list[r.BatchRecord] = []
    for pending, offsets in taken.values():
        record = pending.record
        returned.append(r.BatchRecord(
            record.topic_filter, record.stream, record.begin, record.end,
            record.first_seqno, record.count, record.max_qos, record.no_local,
            sorted(set(range(record.count)) - set(offsets))))
        record.done.extend(offsets)
        pending.remaining -= len(offsets)
    return returned


def returned_write(client_id: str, record: r.BatchRecord, unsent: bool) -> Write:
    """The `x` record handing `record`'s deliveries not done to the group."""
    return (g.returned_key(record.topic_filter, record.stream.shard, client_id,
                           g.unique_id()), g.returned_to_bytes(record, unsent))


def sync_shards(session: "DurableSession", key: str) -> set[int]:
    """The shards of the share's group this session owns now: readers of shards it lost
    stop, the group's positions in shards it gained are read (another member may have
    read them since this session last did)."""
    ctx = session._ctx
    groups = ctx.groups
    owned = groups.readable(key, session) if groups is not None else set()
    held = session._group_shards.get(key, {})
    current = set(held)
    for shard in current - owned:
        stop_shard(session, key, shard)
    gained = owned - current
    if gained and session._settling is not None and not session._settling.done():
        # What it read of a shard before it stopped reading it is still being recorded:
        # the group's positions that moves are not stored yet, and read now they would
        # have it read the same again. Gained once they are (`_settled`).
        owned -= gained
        gained = set()
    session._group_shards[key] = {shard: held[shard] for shard in owned - gained}
    if gained:
        assert groups is not None  # (none: no shard is owned)
        positions = session._positions.setdefault(key, {})
        for shard in gained:
            session._group_shards[key][shard] = ctx.store.owner_tenure(key, shard)
            positions.update(ctx.store.load_group_positions(key, shard))
            groups.offer_returned(key, shard)  # what members handed back in it
    return owned


def stop_shard(session: "DurableSession", key: str, shard: int
               ) -> list[asyncio.Future[None]]:
    """Stops reading the group's shard (what was read of it and not sent goes back to
    the group); returns the batch records still being written, which must be stored
    before another member reads on from the group's position."""
    return_unsent(session, key, shard)
    readers = session._readers.get(key, {})
    for stream in [stream for stream in readers if stream.shard == shard]:
        readers.pop(stream).cancel()
    positions = session._positions.get(key, {})
    for stream in [stream for stream in positions if stream.shard == shard]:
        del positions[stream]
    session._group_shards.get(key, {}).pop(shard, None)
    hold_gains(session)
    return [written for written, _, _ in session._recording]


def hold_gains(session: "DurableSession") -> None:
    """It stops reading a shard of its groups: shards it is given from now on wait for
    the batch records being written now (`sync_shards`)."""
    if session._recording:
        written = session._settling = session._recording[-1][0]
        written.add_done_callback(partial(_settled, session))


def _settled(session: "DurableSession", written: "asyncio.Future[None]") -> None:
    if session._settling is written:
        session._settling = None
        session.refresh_streams()


def adopt_returned(session: "DurableSession", key: str, shard: int,
                   among: Collection[bytes] | None = None) -> None:
    """Takes over the deliveries of the group's shard that members handed back (those
    of `among`, if given: the returned keys this node's replica of the shard is known
    to hold the messages of, groups.py): they go to this member as new deliveries
    (DUP 0), each batch under a batch record of this session, written with the returned
    one's delete, so a restart in between loses nor doubles any. Of those a member's
    ended session left unacknowledged (maybe sent), QoS 2 ones are dropped: they must
    not reach another member (MQTT-4.8.2-5)."""
    ctx = session._ctx
    store = ctx.store
    written: asyncio.Future[None] | None = None
    for returned_key, (record, unsent) in store.load_returned(key, shard):
        if among is not None and returned_key not in among:
            continue
        options = session.subscriptions.get(key)
        if options is None:
            return
        ids = (options.identifier,) if options.identifier is not None else ()
        first = session._next_seqno
        session._next_seqno += record.count
        done = set(record.done)
        adopted = r.BatchRecord(key, record.stream, record.begin, record.end, first,
                                record.count, record.max_qos, record.no_local)
        pending = Pending(adopted, 0)
        deliveries: list[Delivery] = []
        for offset, (ttv, qos) in enumerate(read_window(ctx, session.client_id, record)):
            if offset in done:
                continue
            if qos == 2 and not unsent:
                done.add(offset)
                ctx.stats.drop("shared_qos2_member_ended")
                continue
            retain = ttv.retain and options.retain_as_published
            deliveries.append(Delivery(message_from_ttv(ttv), qos, retain, ids,
                                       r.packet_id_of(first + offset), pending))
        adopted.done = sorted(done)
        writes: list[Write] = [(returned_key, None)]
        if deliveries:
            pending.remaining = len(deliveries)
            session._pending[first] = pending
            writes.append((r.batch_key(session.client_id, first), adopted.to_bytes()))
            writes.append((r.acked_key(session.client_id, first),
                           r.acked_to_bytes(adopted.done, adopted.count)))
        if not unsent:
            ctx.stats.shared_adopted += len(deliveries)
        written = store.write(writes, ctx.replicated)
        store.taking.add(returned_key)
        written.add_done_callback(partial(_taken, store.taking, returned_key))
        session._send_once_written(written, pending if deliveries else None, deliveries)
    groups = ctx.groups
    if written is not None and groups is not None:
        # Refused (the shard moved on while the take was on its way), the batches are
        # still there, and nothing else would offer them to the shard's owner again.
        loop = asyncio.get_running_loop()
        written.add_done_callback(lambda _: loop.call_soon(groups.offer_returned, key,
                                                           shard))


def _taken(taking: set[bytes], key: bytes, _: object) -> None:
    taking.discard(key)


def stalled_since(session: "DurableSession", now: float, timeout: float) -> bool:
    """Whether the client's window is full and nothing was acknowledged for `timeout`
    seconds (a group member so stalled holds back only what it has)."""
    connection = session.connection
    if connection is None or len(session.inflight) < connection.send_window:
        return False
    return now - session.last_ack >= timeout


def handed_back(session: "DurableSession") -> list[tuple[r.BatchRecord, bool]]:
    """The session ends: what its shared subscriptions' batches hold not acknowledged,
    per batch, and whether it was never sent (then any QoS goes on to another member;
    otherwise QoS 1 only). A session restored at start-up whose client did not come back
    has its batches in the store only, each delivery perhaps sent."""
    if session.loaded:
        unsent = take_unsent(session)
        records = [pending.record for pending in session._pending.values()]
    else:
        unsent = []
        stored = session._ctx.store.load(session.client_id)
        records = stored.batches if stored is not None else []
    return [(record, True) for record in unsent] + [
        (record, False) for record in records
        if record.topic_filter.startswith("$share/") and len(set(record.done)) < record.count]
