"""How a durable session is laid out in the `sessions` database: keys and values.

One key per independently changing piece, so each change is a small blind write and
transactions of one session never conflict with each other:

    h\\0<site>                               a node's heartbeat (wall clock seconds)
    m\\0<client id>                          meta: expiry, protocol, connection state, will,
                                            the site of the node that owns it and its
                                            ownership epoch (ownership.py)
    s\\0<client id>\\0<filter>                a subscription: options and start time
    p\\0<client id>\\0<filter>\\0<stream>      read position in a stream (or "done")
    b\\0<client id>\\0<seqno>                 a batch sent but not fully acknowledged
    k\\0<client id>\\0<seqno>                 which of that batch's deliveries were acknowledged
    r\\0<client id>\\0<seqno>                 QoS 2 delivery whose PUBREC arrived (PUBREL owed)
    a\\0<client id>\\0<packet id>             QoS 2 PUBLISH received, PUBREL not yet
    e\\0<client id>                          the epoch of its session that ended last (replicated
                                            `sessions` only: ownership.py)

Sequence numbers (seqno) count this session's QoS 1/2 deliveries; the packet identifier is
derived from the seqno, so a batch replayed after a restart carries the same identifiers it
had on the wire before (MQTT-4.4.0-1). Values are JSON, readable by `broker ctl sessions`.
"""

import base64
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Final

from broker.ds import Stream
from broker.mqtt.constants import MAX_PACKET_ID
from broker.mqtt.packets import Will
from broker.mqtt.properties import WILL_PROPERTIES, decode_properties, encode_properties
from broker.session.session import SubscriptionOptions

SEP: Final = b"\x00"
LEGACY_HEARTBEAT_KEY: Final = b"h"  # before heartbeats were per site


def heartbeat_key(site: str) -> bytes:
    """A node's last sign of life (wall clock), for the sessions it had open; one key per
    site, as a replicated `sessions` database holds every node's."""
    return _key(b"h", site)
_STREAM: Final = struct.Struct(">HII")
_SEQNO: Final = struct.Struct(">Q")
_PACKET_ID: Final = struct.Struct(">H")


def packet_id_of(seqno: int) -> int:
    return (seqno - 1) % MAX_PACKET_ID + 1


def _key(kind: bytes, client_id: str, *parts: bytes) -> bytes:
    return SEP.join((kind, client_id.encode(), *parts))


def prefix(kind: bytes, client_id: str) -> bytes:
    """Every key of one kind for one client (the trailing separator keeps `a` from `ab`)."""
    return _key(kind, client_id) + SEP


def meta_key(client_id: str) -> bytes:
    return _key(b"m", client_id)


def ended_key(client_id: str) -> bytes:
    return _key(b"e", client_id)


TOMBSTONE_SWEEP_KEY: Final = b"w"
"""Not stored: the cutoff of a command sweeping tombstones (ownership.sweep_writes)."""


def subscription_key(client_id: str, topic_filter: str) -> bytes:
    return _key(b"s", client_id, topic_filter.encode())


def position_key(client_id: str, topic_filter: str, stream: Stream) -> bytes:
    return _key(b"p", client_id, topic_filter.encode(),
                _STREAM.pack(stream.shard, stream.generation, stream.id))


def offset_of(packet_id: int, first_packet_id: int) -> int:
    """Which delivery of a batch a packet identifier names (a batch is far shorter than the
    identifier space, so the wrap-around is unambiguous)."""
    return (packet_id - first_packet_id) % MAX_PACKET_ID


def batch_key(client_id: str, first_seqno: int) -> bytes:
    return _key(b"b", client_id, _SEQNO.pack(first_seqno))


def acked_key(client_id: str, first_seqno: int) -> bytes:
    return _key(b"k", client_id, _SEQNO.pack(first_seqno))


def acked_to_bytes(done: list[int], entries: int) -> bytes:
    """A bitmap, bit k = the k-th delivery of the batch was acknowledged: rewritten at every
    acknowledgement flush, so it is kept to a few bytes (the record itself is written once)."""
    bits = bytearray((entries + 7) // 8)
    for offset in done:
        bits[offset >> 3] |= 1 << (offset & 7)
    return bytes(bits)


def acked_from_bytes(raw: bytes) -> list[int]:
    return [i for i in range(len(raw) * 8) if raw[i >> 3] >> (i & 7) & 1]


def released_key(client_id: str, seqno: int) -> bytes:
    return _key(b"r", client_id, _SEQNO.pack(seqno))


def awaiting_rel_key(client_id: str, packet_id: int) -> bytes:
    return _key(b"a", client_id, _PACKET_ID.pack(packet_id))


def seqno_of_key(key: bytes) -> int:
    return _SEQNO.unpack(key[-_SEQNO.size:])[0]  # type: ignore[no-any-return]


def packet_id_of_key(key: bytes) -> int:
    return _PACKET_ID.unpack(key[-_PACKET_ID.size:])[0]  # type: ignore[no-any-return]


def position_parts(key: bytes, client_id: str) -> tuple[str, int, int, int]:
    """(filter, shard, generation, stream id) back from a position key."""
    body = key[len(prefix(b"p", client_id)):]
    topic_filter = body[:-_STREAM.size - 1].decode()
    shard, generation, stream = _STREAM.unpack(body[-_STREAM.size:])
    return topic_filter, shard, generation, stream


# One encoder for every record: `json.dumps` with options builds a new one per call, which
# cost more than the encoding (several records are written per batch).
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"))


def dumps(value: dict[str, Any]) -> bytes:
    return _ENCODER.encode(value).encode()


def loads(raw: bytes) -> dict[str, Any]:
    return json.loads(raw)  # type: ignore[no-any-return]


@dataclass(slots=True)
class Meta:
    expiry_interval: int
    protocol: int
    connected: bool
    disconnected_at: float | None  # wall clock, seconds
    will: Will | None = None
    site: str = ""  # the node that owns the session: it alone restores it at start-up
    epoch: int = 0  # grows each time the session moves to another node (ownership.py)
    created: bool = False  # written by the node that started the session (ownership.py)
    # Connected, but its in-flight window full and unacknowledged for a while: its durable
    # groups pass it over (groups.py).
    stalled: bool = False

    def to_bytes(self) -> bytes:
        return dumps({
            "expiry": self.expiry_interval, "proto": self.protocol, "connected": self.connected,
            "disconnected_at": self.disconnected_at,
            "will": will_to_json(self.will) if self.will is not None else None,
            "site": self.site, "epoch": self.epoch, "created": self.created,
            **({"stalled": True} if self.stalled else {}),
        })

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Meta":
        value = loads(raw)
        will = value.get("will")
        return cls(value["expiry"], value["proto"], value["connected"],
                   value["disconnected_at"], will_from_json(will) if will else None,
                   value.get("site", ""), value.get("epoch", 0), value.get("created", False),
                   value.get("stalled", False))


def will_to_json(will: Will) -> dict[str, Any]:
    return {
        "topic": will.topic, "qos": will.qos, "retain": will.retain,
        "payload": base64.b64encode(will.payload).decode(),
        "props": base64.b64encode(encode_properties(will.properties)).decode(),
    }


def will_from_json(value: dict[str, Any]) -> Will:
    raw = base64.b64decode(value["props"])
    properties, _ = decode_properties(raw, 0, len(raw), WILL_PROPERTIES)
    return Will(value["topic"], base64.b64decode(value["payload"]), value["qos"],
                value["retain"], properties)


@dataclass(slots=True)
class BatchRecord:
    """Deliveries of one fetched batch that need acknowledging: which stream, the read
    window (positions `begin` < timestamp <= `end`), and how the batch was read: `count`
    QoS 1/2 deliveries, the k-th with seqno `first_seqno + k`. Which messages those are
    follows from the window alone: every message of it the subscription's filter accepts,
    except the session's own when `no_local` was set and those whose QoS capped at `max_qos`
    is 0, in stored order. So the record stays a few dozen bytes however long the batch."""

    topic_filter: str
    stream: Stream
    begin: int
    end: int
    first_seqno: int
    count: int
    max_qos: int
    no_local: bool
    # Offsets of acknowledged deliveries: kept under their own key (`acked_key`), since
    # they change at every acknowledgement flush and the record does not.
    done: list[int] = field(default_factory=list)
    # Seqnos of QoS 2 deliveries whose PUBREC arrived (a `released_key` each).
    released: list[int] = field(default_factory=list)

    def __init__(self, topic_filter: str, stream: Stream, begin: int, end: int,
                 first_seqno: int, count: int, max_qos: int, no_local: bool,
                 done: list[int] | None = None) -> None:
        # Written out: the dataclass-generated __init__ is interpreted even when the module
        # is compiled, and one record is made per batch read.
        self.topic_filter = topic_filter
        self.stream = stream
        self.begin = begin
        self.end = end
        self.first_seqno = first_seqno
        self.count = count
        self.max_qos = max_qos
        self.no_local = no_local
        self.done = [] if done is None else done
        self.released = []

    def to_bytes(self) -> bytes:
        s = self.stream
        return dumps({"filter": self.topic_filter, "stream": [s.db, s.shard, s.generation, s.id],
                      "begin": self.begin, "end": self.end, "first": self.first_seqno,
                      "count": self.count, "qos": self.max_qos, "nl": self.no_local})

    @classmethod
    def from_bytes(cls, raw: bytes) -> "BatchRecord":
        value = loads(raw)
        db, shard, generation, stream = value["stream"]
        return cls(value["filter"], Stream(db, shard, generation, stream), value["begin"],
                   value["end"], value["first"], value["count"], value["qos"], value["nl"])


def subscription_to_bytes(options: SubscriptionOptions, since: int) -> bytes:
    return dumps({"qos": options.qos, "nl": options.no_local, "rap": options.retain_as_published,
                  "rh": options.retain_handling, "id": options.identifier, "since": since})


def subscription_from_bytes(raw: bytes) -> tuple[SubscriptionOptions, int]:
    value = loads(raw)
    options = SubscriptionOptions(value["qos"], value["nl"], value["rap"], value["rh"],
                                  value["id"])
    return options, value["since"]


def split_key(key: bytes) -> tuple[bytes, str]:
    """(kind, client id) of any key (client IDs cannot contain U+0000, MQTT-1.5.4-2)."""
    kind, _, rest = key.partition(SEP)
    client_id, _, _ = rest.partition(SEP)
    return kind, client_id.decode()
