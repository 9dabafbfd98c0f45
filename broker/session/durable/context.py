"""What every durable session of a node shares, and how a stored message and a subscription
key are seen by a session."""

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from broker.ds import TTV, DurableStorage
from broker.mqtt.topic import parse_shared
from broker.session.durable.store import SessionStore
from broker.session.durable.streams import Streams, is_stream_key
from broker.session.message import Message, stored_message
from broker.stats import Stats

if TYPE_CHECKING:
    from broker.session.durable.groups import GroupManager


class DurableContext:
    """What every durable session of a node shares. (A plain class: a dataclass costs a
    start ~0.5 ms to build, issue 42.)"""

    __slots__ = ("batch_size", "ds", "groups", "replicated", "seen_everywhere", "stats",
                 "store", "streams", "ttl")

    def __init__(self, ds: DurableStorage, store: SessionStore, stats: Stats, batch_size: int,
                 ttl: float = 0.0) -> None:
        self.ds = ds
        self.store = store
        self.stats = stats
        self.batch_size = batch_size
        self.ttl = ttl  # durable_sessions.session_ttl
        # Durable shared-subscription groups (groups.py); set once the node made it.
        self.groups: GroupManager | None = None
        # Replicated `sessions` database: a shared subscription's batch is sent only once
        # its record is committed, since the replicas may refuse it (group_fencing.py).
        self.replicated = False
        # Replicated: returns once the other nodes applied what this one did of `sessions`,
        # so they store for a subscription its SUBACK promises (peer_applied.py).
        self.seen_everywhere: Callable[[], Awaitable[None]] | None = None
        # Named streams (streams.py); set once the node made them.
        self.streams: Streams | None = None

    def read_filter(self, key: str) -> str | None:
        """The filter a subscription key reads from Durable Storage; None for a stream's
        that does not exist (its readers find nothing)."""
        if is_stream_key(key):
            return self.streams.read_filter(key) if self.streams is not None else None
        return ds_filter(key)


def ds_filter(key: str) -> str:
    """The filter a subscription key reads from Durable Storage (a share's, without its
    `$share/<group>/`)."""
    return parse_shared(key)[1] if key.startswith("$share/") else key


def message_from_ttv(ttv: TTV) -> Message:
    """A stored message as the broker's own: one handed over from its write, or read back
    by a storage that makes them (`stored_message`), is that already."""
    if isinstance(ttv, Message):
        return ttv
    return stored_message(ttv.topic, ttv.payload, ttv.qos, ttv.retain, ttv.publisher,
                          ttv.properties, ttv.timestamp)
