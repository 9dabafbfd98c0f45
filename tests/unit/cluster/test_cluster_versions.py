"""Mixed-version rules: what the handshake announces and refuses, and when the cluster's
effective version rises (broker/cluster/versions.py, broker/cluster/handshake.py)."""

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from broker.cluster import versions
from broker.cluster.handshake import REASONS, Handshake, Identity, Refused, Role
from broker.cluster.service import Cluster
from broker.cluster.versions import LEGACY, MINE, Speaks
from broker.config.loader import load_config
from broker.version import RELEASE

A = Identity("AAAA", "a@h", "127.0.0.1", 1)
B = Identity("BBBB", "b@h", "127.0.0.1", 2)
OLD = Speaks("0.1.0", 0, 0)
NEXT = Speaks("0.3.0", 1, versions.HIGHEST + 1)


def _run(dialer: Handshake, listener: Handshake) -> None:
    to_listener = [dialer.start()]
    while to_listener:
        to_dialer = [reply for m in to_listener for reply in listener.receive(m)]
        to_listener = [reply for m in to_dialer for reply in dialer.receive(m)]


def _legacy(payload: bytes) -> bytes:
    """What release 0.1.0 sends: the same message without the fields it never had."""
    message = json.loads(payload)
    message.pop("release", None)
    message.pop("cluster_version", None)
    return json.dumps(message).encode()


def test_this_release_announces_its_release_and_range_and_keeps_wire_version_1() -> None:
    hello = json.loads(Handshake(Role.DIALER, A, "c", "s").start())
    assert hello["v"] == 1  # release 0.1.0 refuses any other
    assert hello["release"] == RELEASE
    assert hello["cluster_version"] == [versions.LOWEST, versions.HIGHEST]
    assert Speaks(RELEASE, versions.LOWEST, versions.HIGHEST) == MINE


def test_both_sides_learn_what_the_other_speaks() -> None:
    dialer = Handshake(Role.DIALER, A, "c", "s", cluster_version=1)
    listener = Handshake(Role.LISTENER, B, "c", "s", cluster_version=1, speaks=NEXT)
    _run(dialer, listener)
    assert dialer.done and listener.done
    assert dialer.peer_speaks == NEXT and listener.peer_speaks == MINE


def test_a_peer_without_the_fields_is_release_0_1_0_at_cluster_version_0() -> None:
    listener = Handshake(Role.LISTENER, B, "c", "s", cluster_version=0)
    replies = listener.receive(_legacy(Handshake(Role.DIALER, A, "c", "s").start()))
    assert replies and json.loads(replies[0])["type"] == "challenge"
    assert listener.peer_speaks == LEGACY == Speaks("0.1.0", 0, 0)


def _refused_by(side: str, rewrite: Callable[[bytes], bytes], cluster_version: int = 0
                ) -> tuple[Handshake, Refused]:
    """This tree's handshake on `side` of a link, refusing the first message of its peer
    (A) as `rewrite` makes it; the handshake and its refusal."""
    ours = Handshake(Role.LISTENER if side == "listener" else Role.DIALER, B, "c", "s",
                     cluster_version=cluster_version)
    theirs = Handshake(Role.DIALER if side == "listener" else Role.LISTENER, A, "c", "s")
    with pytest.raises(Refused) as refused:
        if side == "listener":
            ours.receive(rewrite(theirs.start()))
        else:
            ours.receive(rewrite(theirs.receive(ours.start())[0]))
    return ours, refused.value


@pytest.mark.parametrize("side", ["listener", "dialer"])
def test_a_0_1_0_peer_is_refused_once_the_cluster_runs_version_1(side: str) -> None:
    """Whichever side of the link runs this tree refuses it: release 0.1.0 checks nothing."""
    _, refused = _refused_by(side, _legacy, cluster_version=1)
    assert refused.reason == versions.TOO_OLD in REASONS
    assert "release 0.1.0" in str(refused) and "a@h" in str(refused)
    assert json.loads(Handshake.refusal(refused)) == {"type": "refused", "reason": "too old"}


def test_this_tree_is_refused_by_a_cluster_beyond_what_it_runs() -> None:
    with pytest.raises(Refused) as refused:
        _run(Handshake(Role.DIALER, A, "c", "s"),
             Handshake(Role.LISTENER, B, "c", "s", speaks=NEXT,
                       cluster_version=versions.HIGHEST + 1))
    assert refused.value.reason == "too old"


def test_a_release_that_no_longer_runs_the_effective_version_is_refused_as_too_new() -> None:
    assert versions.refusal(NEXT, 0) is not None
    assert versions.refusal(NEXT, 0)[0] == versions.TOO_NEW  # type: ignore[index]
    assert versions.refusal(NEXT, 1) is None and versions.refusal(NEXT, 2) is None
    assert versions.refusal(MINE, 0) is None and versions.refusal(MINE, 1) is None
    assert versions.refusal(OLD, 0) is None


@pytest.mark.parametrize("fields", [
    {"release": "0.2.0"},                      # one without the other
    {"cluster_version": [0, 1]},
    {"release": "", "cluster_version": [0, 1]},
    {"release": 2, "cluster_version": [0, 1]},
    {"release": "0.2.0", "cluster_version": [1, 0]},
    {"release": "0.2.0", "cluster_version": [0]},
    {"release": "0.2.0", "cluster_version": [0, "1"]},
    {"release": "0.2.0", "cluster_version": [-1, 1]},
    {"release": "0.2.0", "cluster_version": [True, 1]},
    {"release": "x" * 65, "cluster_version": [0, 1]},
])
def test_garbled_version_fields_are_malformed(fields: dict[str, object]) -> None:
    hello = json.loads(_legacy(Handshake(Role.DIALER, A, "c", "s").start()))
    with pytest.raises(Refused) as refused:
        Handshake(Role.LISTENER, B, "c", "s").receive(json.dumps({**hello, **fields}).encode())
    assert refused.value.reason == "malformed"


def test_the_version_rises_to_what_every_member_runs_and_never_falls() -> None:
    top = versions.HIGHEST
    assert versions.next_version(0, [MINE, MINE, MINE]) == top
    assert versions.next_version(0, [MINE, NEXT]) == top  # the least of the highest
    assert versions.next_version(top, [NEXT, NEXT]) == top + 1
    assert versions.next_version(top, [MINE, MINE]) is None  # already there
    assert versions.next_version(top + 1, [MINE, OLD]) is None  # never lower
    assert versions.next_version(0, [MINE, OLD, MINE]) is None  # one member runs 0.1.0


def test_a_member_whose_code_is_unknown_holds_the_version() -> None:
    """Down or not linked: it may come back running older code."""
    assert versions.next_version(0, [MINE, None, MINE]) is None
    assert versions.next_version(0, []) is None


def test_other_code_asks_what_a_linked_peer_speaks(tmp_path: Path) -> None:
    """What Raft's leadership transfer asks before it sends TimeoutNow to a peer."""
    cluster = Cluster(load_config(None, [f"node.data_dir={tmp_path}", "node.cookie=c"]))
    for site, speaks in (("OLD", LEGACY), ("NEW", MINE)):
        cluster.links[site] = SimpleNamespace(  # type: ignore[assignment]
            handshake=SimpleNamespace(peer_speaks=speaks))
    assert cluster.speaks(cluster.me.site) == MINE and cluster.speaks("OLD") == LEGACY
    assert cluster.supports("NEW", versions.TIMEOUT_NOW)
    assert not cluster.supports("OLD", versions.TIMEOUT_NOW)
    assert cluster.speaks("DOWN") is None and not cluster.supports("DOWN", 0)


@pytest.mark.parametrize("side", ["listener", "dialer"])
def test_a_peer_speaking_a_newer_handshake_is_refused_naming_it_and_what_to_run(
        side: str) -> None:
    """A later release whose handshake is no longer version 1: refused on either side of
    the link, the log naming the node, its release and both versions; the peer is told the
    reason."""
    def newer(payload: bytes) -> bytes:
        return json.dumps({**json.loads(payload), "v": 2, "release": "1.0.0",
                           "cluster_version": [3, 4]}).encode()

    ours, refused = _refused_by(side, newer)
    assert refused.reason == "version mismatch" in REASONS
    assert str(refused) == (
        f"version mismatch: a@h, release 1.0.0 speaks handshake version 2, this release"
        f" ({RELEASE}) speaks 1: upgrade through a release that speaks both")
    assert json.loads(Handshake.refusal(refused)) == {"type": "refused",
                                                      "reason": "version mismatch"}
    assert not ours.done and ours.peer_speaks is None
