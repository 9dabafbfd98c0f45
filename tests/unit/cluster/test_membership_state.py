"""The member list as a pure state machine: facts in, decisions out."""

from broker.cluster.handshake import Identity
from broker.cluster.membership import Membership, Status

ME = Identity("S0", "n0@h0", "h0", 1)
P1 = Identity("S1", "n1@h1", "h1", 1)
P2 = Identity("S2", "n2@h2", "h2", 1)


def test_seeds_are_dialled_with_backoff_and_self_is_skipped() -> None:
    membership = Membership(ME, seeds=[("h0", 1), ("h1", 1)], min_backoff=1, max_backoff=4)
    assert membership.dial_targets(0, set()) == [("h1", 1)]
    assert membership.dial_targets(0.5, set()) == []
    assert membership.dial_targets(1.0, set()) == [("h1", 1)]
    assert membership.dial_targets(2.5, set()) == []  # second delay is 2 s
    assert membership.dial_targets(3.0, set()) == [("h1", 1)]


def test_gossip_spreads_members_and_links_mark_them_up_and_down() -> None:
    membership = Membership(ME, seeds=[("h1", 1)])
    assert membership.up(P1, 0) is True
    assert membership.learn([P1, P2, ME], 0) == [P2]
    assert membership.dial_targets(0, {"S1"}) == [("h2", 1)]
    membership.up(P2, 1)
    assert sorted(membership.running()) == ["S1", "S2"]
    assert membership.down("S2", 2) is True
    assert membership.down("S2", 3) is False
    assert membership.members["S2"].status is Status.DOWN


def test_a_member_moves_address_under_the_same_site() -> None:
    membership = Membership(ME)
    membership.up(P1, 0)
    moved = Identity("S1", "n1@h1", "10.0.0.9", 1)
    assert membership.up(moved, 1) is False
    assert membership.members["S1"].identity.host == "10.0.0.9"


def test_autoclean_drops_long_down_members_and_forget_refuses_them() -> None:
    membership = Membership(ME)
    membership.up(P1, 0)
    membership.up(P2, 0)
    membership.down("S1", 10)
    assert membership.autoclean(15, after=10) == []
    assert membership.autoclean(20, after=10) == ["S1"]
    assert membership.forget("S2") is True
    assert membership.learn([P2], 21) == []  # gossip does not bring a removed node back


def test_member_list_survives_a_restart() -> None:
    membership = Membership(ME)
    membership.up(P1, 0)
    membership.forget("S9")
    restored = Membership(ME)
    restored.restore(membership.to_json(), 5)
    assert restored.members["S1"].status is Status.DOWN
    assert restored.removed == {"S9"}


def test_a_node_back_with_a_new_site_replaces_its_old_one_once_that_is_down() -> None:
    membership = Membership(ME)
    membership.up(P1, 0)
    reborn = Identity("S1b", "n1@h1", "h1", 1)
    assert membership.replaced_by(reborn) == []  # S1 is up: two nodes claim one name
    membership.down("S1", 1)
    membership.up(reborn, 2)
    assert membership.replaced_by(reborn) == ["S1"]
    assert membership.replaced_by(P2) == []
