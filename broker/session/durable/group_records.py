"""How a durable shared-subscription group is laid out in the `sessions` database.

A group is named by its members' subscription key, `$share/<group>/<filter>` (the *share*).
Its members are the durable sessions holding that subscription (their `s` keys,
records.py); the group's own state is:

    g\\0<share>                              the group: when it started (microseconds)
    o\\0<share>\\0<shard>                     who reads the shard for the group: a member
                                            (`own`), a member asked to let go (`revoke`), or
                                            no one (`free`), with the state it replaced and
                                            its tenure (new each time the shard changes hands)
    q\\0<share>\\0<stream>                    the group's read position in a stream
    x\\0<share>\\0<shard>\\0<client>\\0<seqno>  deliveries of a member's batch handed back to
                                            the group: read for it and never sent (`unsent`:
                                            any QoS), or left unacknowledged when its session
                                            ended (QoS 1 only, MQTT-4.8.2-5); the shard's next
                                            owner delivers them

The shard is the unit of assignment: a publisher's messages live in one shard, so each
member receives a publisher's messages in order while the membership stays the same, and
the assignment is a handful of keys however many streams or generations the shard holds.
Values are JSON, like every other record of the database.
"""

import struct
import time
from typing import Final, NamedTuple

from broker.ds import Stream
from broker.session.durable.records import SEP, BatchRecord, dumps, loads

_SHARD: Final = struct.Struct(">H")
_STREAM: Final = struct.Struct(">HII")
_SEQNO: Final = struct.Struct(">Q")

OWN: Final = "own"
REVOKE: Final = "revoke"
FREE: Final = "free"

GROUP_KINDS: Final = frozenset((b"g", b"o", b"q", b"x"))


def _key(kind: bytes, share: str, *parts: bytes) -> bytes:
    return SEP.join((kind, share.encode(), *parts))


def prefix(kind: bytes, share: str) -> bytes:
    return _key(kind, share) + SEP


def group_key(share: str) -> bytes:
    return _key(b"g", share)


def group_to_bytes(since: int) -> bytes:
    return dumps({"since": since})


def group_since(raw: bytes) -> int:
    return int(loads(raw)["since"])


def owner_key(share: str, shard: int) -> bytes:
    return _key(b"o", share, _SHARD.pack(shard))


def shard_of_key(key: bytes) -> int:
    """The shard of an owner key (its last two bytes)."""
    return _SHARD.unpack(key[-_SHARD.size:])[0]  # type: ignore[no-any-return]


class Owner(NamedTuple):
    """Who reads a shard for the group. `client` is None when the shard is free."""

    client: str | None
    state: str

    def to_bytes(self, prev: "Owner | None", tenure: int = 0) -> bytes:
        """With the state it replaces: the replicas admit the change only if that is what
        they hold (group_fencing.py), so two deciders never both hand a shard out. And with
        the tenure of its member: what the member records of the shard names it, so a read
        made in an earlier tenure (on a node cut off meanwhile) is refused even when the
        shard has come back to the same member."""
        value: dict[str, object] = {"client": self.client, "state": self.state,
                 "prev": None if prev is None else [prev.client, prev.state]}
        if tenure:
            value["tenure"] = tenure
        return dumps(value)

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Owner":
        value = loads(raw)
        return cls(value["client"], value["state"])

    @staticmethod
    def tenure_of(raw: bytes | None) -> int:
        """0: none stored, or written before tenures."""
        return 0 if raw is None else int(loads(raw).get("tenure", 0))

    @staticmethod
    def prev_of(raw: bytes) -> "Owner | None":
        prev = loads(raw)["prev"]
        return None if prev is None else Owner(prev[0], prev[1])


def position_key(share: str, stream: Stream) -> bytes:
    return _key(b"q", share, _STREAM.pack(stream.shard, stream.generation, stream.id))


def position_stream(key: bytes) -> Stream:
    shard, generation, stream = _STREAM.unpack(key[-_STREAM.size:])
    return Stream("messages", shard, generation, stream)


def returned_key(share: str, shard: int, client_id: str, unique: int) -> bytes:
    """`unique`: `unique_id()`, so a later return of the same batch, or one by a new
    session of the client ID, never overwrites one not yet taken."""
    return _key(b"x", share, _SHARD.pack(shard), client_id.encode(), _SEQNO.pack(unique))


_last_unique = 0


def unique_id() -> int:
    """Microseconds of the wall clock, and never twice the same in a process."""
    global _last_unique
    _last_unique = max(_last_unique + 1, time.time_ns() // 1000)
    return _last_unique


def returned_prefix(share: str, shard: int) -> bytes:
    return _key(b"x", share, _SHARD.pack(shard)) + SEP


def returned_shard(key: bytes, share: str) -> int:
    start = len(prefix(b"x", share))
    return _SHARD.unpack(key[start:start + _SHARD.size])[0]  # type: ignore[no-any-return]


def returned_client(key: bytes, share: str) -> str:
    start = len(prefix(b"x", share)) + _SHARD.size + 1
    return key[start:-_SEQNO.size - 1].decode()


def returned_to_bytes(record: BatchRecord, unsent: bool) -> bytes:
    """The batch as its member recorded it, with what is not handed back (`done`), and
    whether what is was never sent: then a QoS 2 delivery of it may go to another member
    too (MQTT-4.8.2-4 holds back only what a member was sent)."""
    value = loads(record.to_bytes())
    value["done"] = sorted(record.done)
    if unsent:
        value["unsent"] = True
    return dumps(value)


def returned_from_bytes(raw: bytes) -> tuple[BatchRecord, bool]:
    """The batch, and whether what it hands back was never sent (absent: maybe sent)."""
    record = BatchRecord.from_bytes(raw)
    value = loads(raw)
    record.done = list(value["done"])
    return record, bool(value.get("unsent", False))
