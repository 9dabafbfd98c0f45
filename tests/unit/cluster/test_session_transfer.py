"""A session's state between nodes: round trip, the merge on arrival, garbled input."""

import pytest

from broker.cluster.forward import encode_message
from broker.cluster.session_transfer import (
    TransferError,
    export_backlog,
    export_subscriptions,
    import_backlog,
    import_subscriptions,
)
from broker.session.message import Message
from broker.session.session import Delivery, Session, SubscriptionOptions


def _session() -> Session:
    return Session("c", 300, 100, False)


def _delivery(payload: str) -> Delivery:
    return Delivery(Message("t", payload.encode(), 1, False, "pub"), 1, False, (7,))


def test_subscriptions_round_trip_with_every_option() -> None:
    session = _session()
    session.subscriptions["a/#"] = SubscriptionOptions(1, True, True, 2, 9, None)
    session.subscriptions["$share/g/b"] = SubscriptionOptions(2, share_group="g")
    expiry, subscriptions = import_subscriptions(export_subscriptions(session))
    assert expiry == 300 and subscriptions == session.subscriptions


def test_backlog_goes_first_and_a_message_that_reached_both_nodes_is_kept_once() -> None:
    old = _session()
    both = _delivery("both")
    encode_message(both.message)  # stamped once, as forwarding does
    old.inflight[old.next_packet_id()] = _delivery("inflight")
    old.inflight[old.next_packet_id()] = _delivery("released")
    old.awaiting_comp.add(2)
    old.queue.extend([_delivery("queued"), both])
    old.awaiting_rel.add(11)
    new = _session()
    direct_copy = Delivery(Message("t", b"both", 1, False, "pub", {},
                                   both.message.timestamp), 1, False)
    new.queue.extend([direct_copy, _delivery("direct")])
    import_backlog(new, export_backlog(old))
    assert [d.message.payload for d in new.queue] == [b"queued", b"both", b"direct"]
    assert {pid: d.message.payload for pid, d in new.inflight.items()} == {
        1: b"inflight", 2: b"released"}
    assert new.awaiting_comp == {2} and new.awaiting_rel == {11}
    assert new.inflight[1].subscription_ids == (7,)
    assert new.next_packet_id() == 3  # continues after the old node's identifiers


@pytest.mark.parametrize("garbled", [
    {}, {"inflight": [[1, False, ["!!", 1, False, []]]], "queue": [], "awaiting_rel": [],
         "next_id": 1},
    {"inflight": [[0, False, ["", 1, False, []]]], "queue": [], "awaiting_rel": [],
     "next_id": 1},
    {"inflight": [], "queue": [["AAAA", 1, False, []]], "awaiting_rel": [], "next_id": 1},
])
def test_garbled_backlog_is_refused_whole(garbled: object) -> None:
    session = _session()
    session.queue.append(_delivery("kept"))
    with pytest.raises(TransferError):
        import_backlog(session, garbled)
    assert [d.message.payload for d in session.queue] == [b"kept"] and not session.inflight


def test_garbled_subscriptions_are_refused() -> None:
    with pytest.raises(TransferError):
        import_subscriptions({"expiry": 1, "subs": [["a", "x"]]})
