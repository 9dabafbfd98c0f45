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
    durable = False

    def __init__(self, client_id: str, expiry_interval: int, max_queue: int, queue_qos0: bool):
        self.client_id = client_id
        self.expiry_interval = expiry_interval
        self.subscriptions: dict[str, SubscriptionOptions] = {}
        self.inflight: dict[int, Delivery] = {}
        # Packet IDs of QoS 2 deliveries whose PUBREC arrived: PUBREL sent, PUBCOMP awaited.
        # A set beside `inflight` rather than a flag in a wrapper object per delivery.
        self.awaiting_comp: set[int] = set()
        self.queue: deque[Delivery] = deque()
        self.awaiting_rel: set[int] = set()
        self.connection: Any = None
        self.will: Will | None = None
        self._max_queue = max_queue
        self._queue_qos0 = queue_qos0
        self._next_id = 1

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

    def finish(self, packet_id: int) -> None:
        """An outgoing QoS 1/2 flow ended: acknowledged (PUBACK / PUBCOMP), refused by the
        receiver (PUBREC >= 0x80) or discarded as too large for it. Either way it is never
        sent again, which a durable session records (`completed`)."""
        delivery = self.inflight.pop(packet_id, None)
        self.awaiting_comp.discard(packet_id)
        if delivery is not None:
            self.completed(delivery)

    def completed(self, delivery: Delivery) -> None:
        """A QoS 1/2 delivery is done with (`finish`). Durable sessions record it; a memory
        session has nothing more to do."""

    def released(self, packet_id: int) -> Awaitable[None] | None:
        """PUBREC arrived; the PUBREL waits for what this returns, if anything."""
        return None

    def enqueue(self, delivery: Delivery) -> str | None:
        """Queues a delivery; returns the reason a message was lost doing so, if one was."""
        if delivery.qos == 0 and not self._queue_qos0 and self.connection is None:
            return "offline_qos0"
        self.queue.append(delivery)
        if self._max_queue and len(self.queue) > self._max_queue:
            self.queue.popleft()
            return "queue_full"
        return None
