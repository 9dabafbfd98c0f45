"""A durable session's batches in memory: what is left to acknowledge of a recorded batch,
and the record read back into the deliveries it chose.

A batch record (records.py) holds no message, only the window it read and how it chose
deliveries from it: a replay after a restart, a member taking over a batch another handed
back (group_member.py), and the check of a record against its read all read the window
the same way, here.
"""

import logging

from broker.ds import TTV, Iterator
from broker.session.durable import records as r
from broker.session.durable.context import DurableContext
from broker.session.durable.store import Write

log = logging.getLogger(__name__)


class Pending:
    """A recorded batch and how many of its deliveries are still unacknowledged."""

    __slots__ = ("record", "remaining")

    def __init__(self, record: r.BatchRecord, remaining: int) -> None:
        self.record = record
        self.remaining = remaining


def offset_in(record: r.BatchRecord, packet_id: int) -> int:
    """The offset in `record` of its delivery with `packet_id`."""
    return r.offset_of(packet_id, r.packet_id_of(record.first_seqno))


def read_window(ctx: DurableContext, client_id: str, record: r.BatchRecord
                ) -> list[tuple[TTV, int]]:
    """The recorded batch's QoS 1/2 deliveries and their QoS, chosen from its window as
    the session chose them when it recorded the batch; none once retention dropped the
    window's generation."""
    skip_from = client_id if record.no_local else None
    max_qos = record.max_qos
    found: list[tuple[TTV, int]] = []
    read_filter = ctx.read_filter(record.topic_filter)
    iterator = Iterator(record.stream, read_filter, record.begin) if read_filter else None
    while iterator is not None and iterator.position < record.end:
        iterator, ttvs = ctx.ds.next(iterator, ctx.batch_size)
        if not ttvs:
            break
        for ttv in ttvs:
            qos = ttv.qos if ttv.qos < max_qos else max_qos
            if ttv.timestamp <= record.end and qos and ttv.publisher != skip_from:
                found.append((ttv, qos))
    if found and len(found) != record.count:
        log.error("durable session %s: batch %d read back as %d deliveries, recorded %d",
                  client_id, record.first_seqno, len(found), record.count)
    return found[:record.count]


def completion_writes(client_id: str, record: r.BatchRecord) -> list[Write]:
    """The deletes of a batch all of whose deliveries are done."""
    writes: list[Write] = [(r.batch_key(client_id, record.first_seqno), None),
                           (r.acked_key(client_id, record.first_seqno), None)]
    writes.extend((r.released_key(client_id, seqno), None) for seqno in record.released)
    return writes
