"""Route announcements and forwarded messages as pure codecs and tables."""

import json
import time

import pytest

from broker.cluster.forward import (
    PLAIN,
    ForwardError,
    decode_frame,
    encode_entry,
    encode_message,
)
from broker.cluster.routes import LocalRoutes, RemoteRoutes, RouteError
from broker.mqtt.constants import PropertyId
from broker.session.message import Message


def test_a_filter_is_announced_once_however_many_local_subscribers() -> None:
    local = LocalRoutes()
    local.add("a/#", None, "c1")
    local.add("a/#", None, "c2")
    local.add("b", "g", "c1")
    first = json.loads(local.announcement() or b"")
    assert first == {"seq": 1, "add": [["a/#", None, None], ["b", "g", "c1"]], "del": []}
    local.remove("a/#", None, "c1")
    assert local.announcement() is None
    local.remove("a/#", None, "c2")
    local.add("x", None, "c3")
    local.remove("x", None, "c3")  # added and removed in one turn: nothing said
    assert json.loads(local.announcement() or b"") == {
        "seq": 2, "add": [], "del": [["a/#", None, None]]}


def test_remote_routes_apply_in_order_ask_for_a_resync_on_a_gap_and_purge() -> None:
    local, remote = LocalRoutes(), RemoteRoutes()
    local.add("s/+", None, "c")
    local.add("s/1", "g", "m1")
    remote.receive("B", local.full_set())
    sites, shared = remote.match("s/1")
    assert sites == {"B"} and shared == {("g", "s/1"): [("B", "m1")]}
    local.add("t", None, "c")
    missed = local.announcement()
    local.add("u", None, "c")
    assert remote.receive("B", local.announcement() or b"") is False  # gap
    assert remote.receive("B", missed or b"") is True
    assert remote.receive("B", missed or b"") is True  # duplicate: harmless, ignored
    assert remote.match("u") == (frozenset(), {})
    remote.receive("B", local.full_set())
    assert remote.match("u")[0] == {"B"}
    assert remote.purge("B") == 4
    assert remote.match("s/1") == (frozenset(), {})


@pytest.mark.parametrize("payload", [b"", b"[]", b'{"sync": 1, "routes": [[1, 2]]}',
                                     b'{"sync": 1, "routes": [["a", "g", null]]}'])
def test_garbled_announcements_raise_route_error(payload: bytes) -> None:
    with pytest.raises((RouteError, ValueError)):
        RemoteRoutes().receive("B", payload)


def test_forward_entries_round_trip_with_targets_properties_and_remaining_expiry() -> None:
    message = Message("a/b", b"\x00payload", 1, True, "pub" * 100,
                      {PropertyId.USER_PROPERTY: [("k", "v")]}, expires_at=time.time() + 3600)
    value = encode_message(message)
    frame = (encode_entry(PLAIN, [("g", "a/+", "member")], value)
             + encode_entry(0, [("g2", "a/#", "other")], value))
    (flags, targets, got), (flags2, targets2, _) = decode_frame(frame)
    assert flags == PLAIN and flags2 == 0
    assert targets == [("g", "a/+", "member")] and targets2 == [("g2", "a/#", "other")]
    assert (got.topic, got.payload, got.qos, got.retain, got.publisher) == (
        "a/b", b"\x00payload", 1, True, "pub" * 100)
    assert got.properties[PropertyId.USER_PROPERTY] == [("k", "v")]
    assert got.expires_at is not None and 3590 < got.expires_at - time.time() <= 3601


@pytest.mark.parametrize("cut", [1, 3, 9, 20])
def test_a_truncated_forward_frame_is_refused_whole(cut: int) -> None:
    frame = encode_entry(PLAIN, [("g", "f", "c")], encode_message(Message("t", b"x" * 30)))
    with pytest.raises(ForwardError):
        decode_frame(frame[:-cut])
