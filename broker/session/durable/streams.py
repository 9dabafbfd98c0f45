"""Named streams (EMQX 6.1's MQTT Streams): a topic filter whose messages Durable Storage
keeps from the stream's creation on, replayed by `$stream/<name>` subscriptions.

A stream is one key of the `sessions` database, so it lives where durable sessions live:
on the node's disk with `builtin_local`, on every replica with `builtin_raft` (every node
then stores for every stream, whichever node took the PUBLISH), and it survives restarts:

    t\\0<name>                                {"filter": topic filter, "since": microseconds}

While it exists its filter is one of the node's durable filters (entry `$stream/<name>`), as
a durable session's subscription is, though no session holds it. A subscription to it is a
durable session's subscription like any other, keyed by what the client subscribed to: its
start time (`since`) is the offset the client asked for, and it is read by the session's own
iterators, positions and batch records, so its position survives restarts and moves with
the session to another node, and the replay goes on into live delivery with the same
iterator (no seam to cross).
"""

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Final, NamedTuple

from broker.ds import DurableStorage, now_us
from broker.mqtt.constants import ReasonCode
from broker.mqtt.errors import MQTTError
from broker.mqtt.topic import STREAM_PREFIX as PREFIX
from broker.mqtt.topic import parse_stream, validate_topic_filter
from broker.session.durable.records import SEP, dumps, loads
from broker.session.durable.store import SessionStore, Write

log = logging.getLogger(__name__)

KIND: Final = b"t"
_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,255}")  # EMQX's rule for stream names


class StreamError(ValueError):
    """A stream that cannot be created as asked (the HTTP API's 400 / 409)."""

    def __init__(self, message: str, conflict: bool = False) -> None:
        super().__init__(message)
        self.conflict = conflict


class StreamDef(NamedTuple):
    name: str
    topic_filter: str
    since: int  # created at, microseconds: stored from then on

    def view(self) -> dict[str, object]:
        return {"name": self.name, "topic_filter": self.topic_filter, "created_at": self.since}


def stream_key(name: str) -> bytes:
    return SEP.join((KIND, name.encode()))


def is_stream_key(key: str) -> bool:
    """Whether a subscription key names a stream (`$stream/<name>[/<filter>]`)."""
    return key.startswith(PREFIX)


def split_subscription(key: str) -> tuple[str, str | None]:
    """(name, topic filter or None) of a `$stream/...` key."""
    parsed = parse_stream(key)
    assert parsed is not None
    return parsed


def parse_offset(value: str | None, now: int) -> int:
    """The `stream-offset` user property (EMQX's values) as a start time in microseconds:
    `earliest` (also when absent: MQTT 3.1.1 clients cannot send it) is 0, `latest` now,
    else a UTC timestamp in microseconds."""
    if value is None or value == "earliest":
        return 0
    if value == "latest":
        return now
    if value.isascii() and value.isdigit() and len(value) <= 19:
        return int(value)
    raise MQTTError(f"stream-offset {value[:64]!r}: expected earliest, latest or a UTC"
                    " timestamp in microseconds", ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)


def check_definition(name: str, topic_filter: str) -> None:
    """A stream's name and filter as the HTTP API and auto-creation take them."""
    if not _NAME.fullmatch(name):
        raise StreamError(f"stream name {name[:64]!r}: 1-255 letters, digits, '_', '-', '.'")
    try:
        validate_topic_filter(topic_filter)
    except MQTTError as error:
        raise StreamError(f"stream {name}: topic filter {topic_filter[:64]!r}: {error}") from None
    if topic_filter.startswith(("$share/", PREFIX)):
        raise StreamError(f"stream {name}: topic filter {topic_filter[:64]!r}: a stream"
                          " stores published topics, not $share or $stream filters")


Changed = Callable[[str, str | None, str | None], None]
"""(entry, old filter, new filter): a stream's durable filter to remove and to add."""


class Streams:
    """The node's streams as its `sessions` database holds them."""

    def __init__(self, ds: DurableStorage, store: SessionStore, changed: Changed) -> None:
        self._ds = ds
        self._store = store
        self._changed = changed
        self._streams: dict[str, StreamDef] = {}

    def load(self) -> None:
        """Start-up (`builtin_local`): the streams on disk."""
        for key, value in self._ds.sessions.scan(KIND + SEP):
            self.applied(key, value)

    def clear(self) -> None:
        """Replicated: the replica was replaced whole; its streams come again with it."""
        for name in list(self._streams):
            self._set(name, None)

    def applied(self, key: bytes, value: bytes | None) -> None:
        """A `t` key written (here, or replicated from any node); one that does not parse
        is logged and left out, not the end of the node."""
        name = key[len(KIND + SEP):].decode(errors="replace")
        if value is None:
            self._set(name, None)
            return
        try:
            fields = loads(value)
            stream = StreamDef(name, fields["filter"], int(fields["since"]))
            check_definition(name, stream.topic_filter)
        except (ValueError, KeyError, TypeError) as error:
            log.error("stream record %r in the sessions database left out: %s", key, error)
            return
        self._set(name, stream)

    def _set(self, name: str, stream: StreamDef | None) -> None:
        old = self._streams.pop(name, None)
        if stream is not None:
            self._streams[name] = stream
        old_filter = old.topic_filter if old is not None else None
        new_filter = stream.topic_filter if stream is not None else None
        if old_filter != new_filter:
            self._changed(PREFIX + name, old_filter, new_filter)

    def get(self, name: str) -> StreamDef | None:
        return self._streams.get(name)

    def all(self) -> list[StreamDef]:
        return sorted(self._streams.values(), key=lambda stream: stream.name)

    def __len__(self) -> int:
        return len(self._streams)

    # ---- changes -----------------------------------------------------------------------
    def create(self, name: str, topic_filter: str) -> tuple[StreamDef, asyncio.Future[None]]:
        """The stream (a new one, or the one of that name with that filter): stored here at
        once, written to the `sessions` database (what resolves once it is committed)."""
        check_definition(name, topic_filter)
        existing = self._streams.get(name)
        if existing is not None:
            if existing.topic_filter != topic_filter:
                raise StreamError(f"stream {name} exists with topic filter"
                                  f" {existing.topic_filter!r}", conflict=True)
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return existing, done
        stream = StreamDef(name, topic_filter, now_us())
        self._set(name, stream)
        value = dumps({"filter": topic_filter, "since": stream.since})
        return stream, self._store.write([(stream_key(name), value)])

    def delete(self, name: str) -> asyncio.Future[None] | None:
        """None when there is no such stream. Its stored messages stay until retention drops
        them; subscriptions to it read nothing more."""
        if name not in self._streams:
            return None
        self._set(name, None)
        writes: list[Write] = [(stream_key(name), None)]
        return self._store.write(writes)

    # ---- subscriptions -----------------------------------------------------------------
    def target(self, key: str) -> str:
        """The topic filter a `$stream/...` subscription would read, or MQTTError 0x8F: the
        filter authorization is checked on (a stream's subscriber reads what subscribing
        to its filter would give)."""
        name, topic_filter = split_subscription(key)
        target = self.read_filter(key) or topic_filter
        if target is None:
            raise MQTTError(f"no stream named {name[:64]!r}", ReasonCode.TOPIC_FILTER_INVALID)
        return target

    def read_filter(self, key: str) -> str | None:
        """The filter a `$stream/...` subscription reads; None while its stream does not
        exist (deleted, or not yet replicated here)."""
        stream = self._streams.get(split_subscription(key)[0])
        return stream.topic_filter if stream is not None else None

    def resolve(self, key: str, offset: str | None, auto_create: bool) -> tuple[str, int]:
        """(filter read, start time) of a new `$stream/...` subscription, or MQTTError with
        its SUBACK reason code: 0x8F for a stream that does not exist (and is not created
        from `$stream/<name>/<filter>` with `streams.auto_create`) or whose filter is not
        the one named, 0x83 for a bad offset."""
        name, topic_filter = split_subscription(key)
        now = now_us()
        since = parse_offset(offset, now)
        stream = self._streams.get(name)
        if stream is None and topic_filter is not None and auto_create:
            try:
                stream = self.create(name, topic_filter)[0]
            except StreamError as error:
                raise MQTTError(str(error), ReasonCode.TOPIC_FILTER_INVALID) from None
        if stream is None:
            raise MQTTError(f"no stream named {name[:64]!r}", ReasonCode.TOPIC_FILTER_INVALID)
        if topic_filter is not None and topic_filter != stream.topic_filter:
            raise MQTTError(f"stream {name} has topic filter {stream.topic_filter!r}, not"
                            f" {topic_filter[:64]!r}", ReasonCode.TOPIC_FILTER_INVALID)
        # A stream holds what was published since it was created, whatever else stored.
        return stream.topic_filter, max(since, stream.since)

