"""A session's state as it travels between nodes on a takeover. Pure.

JSON-able, as the RPC channel carries it; messages inside travel as the FORWARD channel
encodes them (Durable Storage's value format, base64). Two parts, because a takeover has two
steps: the subscriptions first (the new node routes to the client from then on), then what
the old node still holds (in-flight window, queue, QoS 2 packet IDs awaiting PUBREL), taken
last so that what reached the old node in between is not lost.

    subscriptions := {"expiry": int, "subs": [[key, qos, nl, rap, rh, subid|null, group|null]]}
    backlog       := {"inflight": [[packet_id, released, delivery]], "queue": [delivery],
                      "awaiting_rel": [packet_id], "next_id": int}
    delivery      := [message (base64), qos, retain, [subscription id]]

A peer is authenticated, but its data is still checked: anything malformed raises
`TransferError` and the takeover goes on without it, never half-applied.
"""

import base64
import struct
from typing import Any

from broker.cluster.forward import decode_message, encode_message
from broker.mqtt.constants import MAX_PACKET_ID
from broker.session.session import Delivery, Session, SubscriptionOptions


class TransferError(ValueError):
    pass


def export_subscriptions(session: Session) -> dict[str, Any]:
    return {
        "expiry": session.expiry_interval,
        "subs": [[key, o.qos, o.no_local, o.retain_as_published, o.retain_handling,
                  o.identifier, o.share_group] for key, o in session.subscriptions.items()],
    }


def import_subscriptions(state: Any) -> tuple[int, dict[str, SubscriptionOptions]]:
    try:
        expiry = int(state["expiry"])
        subscriptions = {
            str(key): SubscriptionOptions(int(qos), bool(nl), bool(rap), int(rh),
                                          None if sid is None else int(sid),
                                          None if group is None else str(group))
            for key, qos, nl, rap, rh, sid, group in state["subs"]
        }
    except (KeyError, TypeError, ValueError) as error:
        raise TransferError(f"garbled subscriptions: {error!r}") from None
    return expiry, subscriptions


def export_backlog(session: Session) -> dict[str, Any]:
    return {
        "inflight": [[packet_id, packet_id in session.awaiting_comp, _delivery(d)]
                     for packet_id, d in session.inflight.items()],
        "queue": [_delivery(d) for d in session.queue],
        "awaiting_rel": sorted(session.awaiting_rel),
        "next_id": session.next_packet_id() if len(session.inflight) < MAX_PACKET_ID else 1,
    }


def import_backlog(session: Session, state: Any) -> None:
    """Into a session that has been receiving on the new node since its subscriptions
    arrived: the old node's in-flight window and queue go first; a message the new node
    also got directly is kept once (where its routes overlapped with the old node's)."""
    try:
        inflight = {int(packet_id): (bool(released), _undelivery(d))
                    for packet_id, released, d in state["inflight"]}
        queue = [_undelivery(d) for d in state["queue"]]
        awaiting_rel = {int(packet_id) for packet_id in state["awaiting_rel"]}
        next_id = int(state["next_id"])
    except (KeyError, TypeError, ValueError, IndexError, struct.error) as error:
        raise TransferError(f"garbled session backlog: {error!r}") from None
    if any(not 0 < packet_id <= MAX_PACKET_ID for packet_id in (*inflight, *awaiting_rel)):
        raise TransferError("packet identifier out of range")
    seen = {_identity(d) for _, d in inflight.values()} | {_identity(d) for d in queue}
    direct = [d for d in session.queue if _identity(d) not in seen]
    session.queue.clear()
    session.queue.extend(queue)
    session.queue.extend(direct)
    for packet_id, (released, delivery) in inflight.items():
        session.inflight[packet_id] = delivery
        if released:
            session.awaiting_comp.add(packet_id)
    session.awaiting_rel |= awaiting_rel
    session.restart_packet_ids(next_id)


def _delivery(delivery: Delivery) -> list[Any]:
    value = base64.b64encode(encode_message(delivery.message)).decode()
    return [value, delivery.qos, delivery.retain, list(delivery.subscription_ids)]


def _undelivery(data: Any) -> Delivery:
    value, qos, retain, ids = data
    return Delivery(decode_message(base64.b64decode(value, validate=True)), int(qos),
                    bool(retain), tuple(int(i) for i in ids))


def _identity(delivery: Delivery) -> tuple[str, int, str, bytes]:
    """The same PUBLISH, whichever node it reached: its origin stamps it once."""
    message = delivery.message
    return message.publisher, message.timestamp, message.topic, message.payload
