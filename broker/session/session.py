"""In-memory session state: subscriptions, the in-flight window and the message queue.

Holds no sockets; the connection that currently owns the session asks it what to send. The
in-flight window is bounded by the client's Receive Maximum; what does not fit waits in the
queue (`mqtt.max_mqueue_len`, oldest dropped), which is also where messages wait while the
client is offline.
"""

from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from broker.mqtt.constants import MAX_PACKET_ID
from broker.mqtt.packets import Will
from broker.session.message import Message


@dataclass(slots=True)
class SubscriptionOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int | None = None
    share_group: str | None = None


@dataclass(slots=True)
class Delivery:
    """One message bound for one session, with the per-subscriber QoS/flags resolved."""

    message: Message
    qos: int
    retain: bool
    # A tuple, so the common case (no identifiers) allocates nothing per delivery.
    subscription_ids: tuple[int, ...] = ()
    # Set by durable sessions, whose identifiers follow their recorded sequence numbers;
    # 0 = the connection assigns one when it sends.
    packet_id: int = 0
    # A durable session's record of the batch this delivery belongs to, where its
    # acknowledgement is counted: carried here rather than looked up by packet identifier.
    batch: Any = None
    # Sent before (a resend deferred until the client's window has room, or replayed after a
    # restart or a move): it goes out with DUP, whenever it goes (MQTT-3.3.1-1).
    sent: bool = False

    def __init__(self, message: Message, qos: int, retain: bool,
                 subscription_ids: tuple[int, ...] = (), packet_id: int = 0,
                 batch: Any = None) -> None:
        # Written out: the dataclass-generated __init__ is interpreted even when the module
        # is compiled, and one Delivery is made per message and subscriber.
        self.message = message
        self.qos = qos
        self.retain = retain
        self.subscription_ids = subscription_ids
        self.packet_id = packet_id
        self.batch = batch
        self.sent = False


class Session:
    """What a kind of session keeps beyond memory, it keeps in the hooks the packet
    handlers call (`subscribe`, `unsubscribe`, `rel_awaited`, `rel_arrived`, `released`,
    `completed`): a memory session keeps nothing more, a durable one records it
    (session/durable). The handlers never ask which kind they hold."""

    # Slots, and containers made when first used (below): ten thousand idle connections
    # should cost little more than their sockets.
    __slots__ = ("_awaiting_comp", "_awaiting_rel", "_max_queue", "_next_id", "_queue",
                 "_queue_qos0", "client_id", "connection", "expiry_interval", "inflight",
                 "subscriptions", "will")
    durable = False

    def __init__(self, client_id: str, expiry_interval: int, max_queue: int, queue_qos0: bool):
        self.client_id = client_id
        self.expiry_interval = expiry_interval
        self.subscriptions: dict[str, SubscriptionOptions] = {}
        self.inflight: dict[int, Delivery] = {}
        # The queue and the two sets are made when first used (`queue`, `awaiting_comp`,
        # `awaiting_rel`): empty, a deque costs ~760 bytes and a set 216, and most idle
        # connections never queue a message or see QoS 2. (An empty dict costs 64: the
        # two dicts are plain, `inflight` being on the path of every QoS 1/2 delivery.)
        self._queue: deque[Delivery] | None = None
        self._awaiting_comp: set[int] | None = None
        self._awaiting_rel: set[int] | None = None
        self.connection: Any = None
        self.will: Will | None = None
        self._max_queue = max_queue
        self._queue_qos0 = queue_qos0
        self._next_id = 1

    @property
    def queue(self) -> deque[Delivery]:
        """Deliveries waiting for room in the in-flight window, or for the client."""
        queue = self._queue
        if queue is None:
            queue = self._queue = deque()
        return queue

    @property
    def queued(self) -> int:
        """len(queue), without making one."""
        queue = self._queue
        return len(queue) if queue is not None else 0

    @property
    def awaiting_comp(self) -> set[int]:
        """Packet IDs of QoS 2 deliveries whose PUBREC arrived: PUBREL sent, PUBCOMP
        awaited. A set beside `inflight` rather than a flag in a wrapper per delivery."""
        awaiting = self._awaiting_comp
        if awaiting is None:
            awaiting = self._awaiting_comp = set()
        return awaiting

    @property
    def awaiting_rel(self) -> set[int]:
        """Packet IDs of QoS 2 PUBLISHes from the client that we own, until their PUBREL."""
        awaiting = self._awaiting_rel
        if awaiting is None:
            awaiting = self._awaiting_rel = set()
        return awaiting

    @awaiting_rel.setter
    def awaiting_rel(self, packet_ids: set[int]) -> None:
        self._awaiting_rel = packet_ids

    def next_packet_id(self) -> int:
        """A packet ID not used by any in-flight delivery (MQTT-2.2.1-3)."""
        inflight = self.inflight
        if len(inflight) >= MAX_PACKET_ID:
            raise RuntimeError("no free packet identifier")
        packet_id = self._next_id
        while packet_id in inflight:
            packet_id = packet_id + 1 if packet_id < MAX_PACKET_ID else 1
        self._next_id = packet_id + 1 if packet_id < MAX_PACKET_ID else 1
        return packet_id

    def restart_packet_ids(self, next_id: int) -> None:
        """Continues where the node that held this session before stopped (a takeover),
        so a new delivery does not reuse an identifier the client may still remember."""
        self._next_id = next_id if 0 < next_id <= MAX_PACKET_ID else 1

    # ---- subscriptions -----------------------------------------------------------------
    def subscribe(self, key: str, options: SubscriptionOptions) -> bool:
        """Adds or replaces the subscription `key` (the filter as the client wrote it,
        `$share/...` included). True when the session reads the subscription's messages
        from Durable Storage itself, so the node is only to store them (a durable filter);
        False when they are to be routed to it."""
        self.subscriptions[key] = options
        return False

    def stored(self) -> Awaitable[None] | None:
        """What waits until the subscriptions made so far are on disk (replicated: committed
        on a majority), for their SUBACK; None: a memory session keeps nothing."""
        return None

    def start_at(self, key: str, since: int) -> bool:
        """The subscription `key`, about to be made, reads stored messages from `since`
        (microseconds: a `$stream` replay). False when the session cannot: a memory session
        reads nothing stored."""
        return False

    def unsubscribe(self, key: str) -> bool:
        """Removes the subscription `key`, which exists; returns what `subscribe` did."""
        del self.subscriptions[key]
        return False

    def is_routed(self, key: str) -> bool:
        """Whether the subscription `key` is routed to the session (else a durable filter:
        `subscribe` said which)."""
        return not self.durable

    # ---- outgoing QoS 1 and 2 ----------------------------------------------------------
    def finish(self, packet_id: int) -> None:
        """An outgoing QoS 1/2 flow ended: acknowledged (PUBACK / PUBCOMP), refused by the
        receiver (PUBREC >= 0x80) or discarded as too large for it. Either way it is never
        sent again, which a durable session records (`completed`)."""
        delivery = self.inflight.pop(packet_id, None)
        if self._awaiting_comp:
            self._awaiting_comp.discard(packet_id)
        if delivery is not None:
            self.completed(delivery)

    def completed(self, delivery: Delivery) -> None:
        """A QoS 1/2 delivery is done with (`finish`). Durable sessions record it; a memory
        session has nothing more to do."""

    def released(self, packet_id: int) -> Awaitable[None] | None:
        """PUBREC arrived for the in-flight QoS 2 delivery: PUBCOMP is awaited now, and the
        PUBREL waits for what this returns, if anything."""
        self.awaiting_comp.add(packet_id)
        return None

    # ---- incoming QoS 2 ----------------------------------------------------------------
    def rel_awaited(self, packet_id: int) -> Awaitable[None] | None:
        """A QoS 2 PUBLISH from the client was taken in: the message is ours until its
        PUBREL, and a resend of it is acknowledged, never routed again. The PUBREC waits
        for what this returns, if anything."""
        self.awaiting_rel.add(packet_id)
        return None

    def rel_arrived(self, packet_id: int) -> bool:
        """The client's PUBREL: whether a QoS 2 PUBLISH of that ID was ours (it is not any
        more)."""
        awaiting = self._awaiting_rel
        if not awaiting or packet_id not in awaiting:
            return False
        awaiting.discard(packet_id)
        return True

    def enqueue(self, delivery: Delivery) -> str | None:
        """Queues a delivery; returns the reason a message was lost doing so, if one was."""
        if delivery.qos == 0 and not self._queue_qos0 and self.connection is None:
            return "offline_qos0"
        queue = self.queue
        queue.append(delivery)
        if self._max_queue and len(queue) > self._max_queue:
            queue.popleft()
            return "queue_full"
        return None
