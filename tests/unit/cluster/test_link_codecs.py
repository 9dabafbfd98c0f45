"""Frames and the cookie handshake, byte for byte, without sockets."""

import json

import pytest

from broker.cluster.frames import Channel, FrameDecoder, FrameError, encode_frame
from broker.cluster.handshake import Handshake, Identity, Refused, Role

A = Identity("AAAA", "a@h1", "h1", 5369)
B = Identity("BBBB", "b@h2", "h2", 5369)


def test_frames_split_anywhere_come_out_whole_and_in_order() -> None:
    stream = b"".join(encode_frame(Channel.RAFT, bytes([i]) * i) for i in range(1, 50))
    decoder = FrameDecoder(1024)
    frames = []
    for start in range(0, len(stream), 7):
        frames += decoder.feed(stream[start:start + 7])
    assert frames == [(Channel.RAFT, bytes([i]) * i) for i in range(1, 50)]
    assert decoder.pending == 0


@pytest.mark.parametrize("length", [0, 1025, 2**32 - 1])
def test_a_frame_length_outside_the_limit_is_refused_before_buffering(length: int) -> None:
    with pytest.raises(FrameError):
        FrameDecoder(1024).feed(length.to_bytes(4, "big") + b"\x01")


def _run(dialer: Handshake, listener: Handshake) -> None:
    to_listener = [dialer.start()]
    while to_listener:
        to_dialer = [reply for m in to_listener for reply in listener.receive(m)]
        to_listener = [reply for m in to_dialer for reply in dialer.receive(m)]


def test_same_cookie_and_cluster_authenticate_both_ways() -> None:
    dialer = Handshake(Role.DIALER, A, "c", "secret")
    listener = Handshake(Role.LISTENER, B, "c", "secret")
    _run(dialer, listener)
    assert dialer.done and listener.done
    assert dialer.peer == B and listener.peer == A


def test_the_cookie_never_travels() -> None:
    dialer = Handshake(Role.DIALER, A, "c", "secret-cookie-value")
    listener = Handshake(Role.LISTENER, B, "c", "secret-cookie-value")
    sent = [dialer.start()]
    sent += listener.receive(sent[0])
    sent += dialer.receive(sent[1])
    assert all(b"secret-cookie-value" not in message for message in sent)


@pytest.mark.parametrize("side", ["dialer", "listener"])
def test_a_wrong_cookie_is_refused_by_whoever_checks_first(side: str) -> None:
    dialer = Handshake(Role.DIALER, A, "c", "right" if side == "listener" else "wrong")
    listener = Handshake(Role.LISTENER, B, "c", "wrong" if side == "listener" else "right")
    with pytest.raises(Refused) as refused:
        _run(dialer, listener)
    assert refused.value.reason == "bad cookie"
    assert not dialer.done and not listener.done


def test_a_recorded_response_cannot_be_replayed_to_a_new_challenge() -> None:
    dialer = Handshake(Role.DIALER, A, "c", "secret")
    first = Handshake(Role.LISTENER, B, "c", "secret")
    hello = dialer.start()
    challenge = first.receive(hello)[0]
    response = dialer.receive(challenge)[0]
    second = Handshake(Role.LISTENER, B, "c", "secret")
    second.receive(hello)  # same hello, fresh listener nonce
    with pytest.raises(Refused, match="bad cookie"):
        second.receive(response)


def test_other_cluster_name_and_removed_sites_are_refused() -> None:
    with pytest.raises(Refused, match="cluster name mismatch"):
        _run(Handshake(Role.DIALER, A, "one", "s"), Handshake(Role.LISTENER, B, "two", "s"))
    with pytest.raises(Refused, match="removed"):
        _run(Handshake(Role.DIALER, A, "c", "s"),
             Handshake(Role.LISTENER, B, "c", "s", refused_sites=frozenset({"AAAA"})))
    joining = Handshake(Role.DIALER, A, "c", "s")
    joining.join = True
    listener = Handshake(Role.LISTENER, B, "c", "s", refused_sites=frozenset({"AAAA"}))
    _run(joining, listener)
    assert listener.done and listener.readmitted


def test_a_member_back_with_another_data_dir_is_refused_both_ways() -> None:
    """Its site is configured, its volume new: as that member it would vote having forgotten
    its votes and the entries it acknowledged."""
    reborn = Identity("AAAA", "a@h", "h", 1, incarnation="new")
    for dialer, listener in (
            (Handshake(Role.DIALER, reborn, "c", "s"),
             Handshake(Role.LISTENER, B, "c", "s", incarnations={"AAAA": "old"})),
            (Handshake(Role.DIALER, B, "c", "s", incarnations={"AAAA": "old"}),
             Handshake(Role.LISTENER, reborn, "c", "s"))):
        with pytest.raises(Refused) as refused:
            _run(dialer, listener)
        assert refused.value.reason == "reborn"
    # The data dir it had, or one its peers never learned (an older node's ""): welcome.
    _run(Handshake(Role.DIALER, reborn, "c", "s"),
         Handshake(Role.LISTENER, B, "c", "s", incarnations={"AAAA": "new"}))
    _run(Handshake(Role.DIALER, reborn, "c", "s"),
         Handshake(Role.LISTENER, B, "c", "s", incarnations={"AAAA": ""}))


def test_a_site_still_leaving_the_raft_groups_is_refused_even_when_joining() -> None:
    joining = Handshake(Role.DIALER, A, "c", "s")
    joining.join = True
    with pytest.raises(Refused, match="still being removed"):
        _run(joining, Handshake(Role.LISTENER, B, "c", "s", refused_sites=frozenset({"AAAA"}),
                                unsettled=frozenset({"AAAA"})))


@pytest.mark.parametrize("payload", [b"", b"\xff\xfe", b"[]", b'{"type": "welcome"}',
                                     json.dumps({"type": "hello", "v": 1, "cluster": "c",
                                                 "site": "X", "node": "x@h"}).encode()])
def test_garbage_in_the_handshake_is_refused_not_raised_as_anything_else(payload: bytes) -> None:
    with pytest.raises(Refused):
        Handshake(Role.LISTENER, B, "c", "s").receive(payload)


def test_a_peer_reason_outside_the_known_ones_is_not_echoed_into_metrics() -> None:
    dialer = Handshake(Role.DIALER, A, "c", "s")
    dialer.start()
    with pytest.raises(Refused) as refused:
        dialer.receive(json.dumps({"type": "refused", "reason": "x" * 10_000}).encode())
    assert refused.value.reason == "refused"
