"""The operator's placement file as Durable Storage groups' targets, and the membership
changes a shard's leader makes towards one: pure."""

import json

import pytest

from broker.cluster.group_members import ADD, PROMOTE, REMOVE, next_change
from broker.cluster.placement import PlacementError, Target, parse
from broker.raft.messages import Config

MEMBERS = {"aa01", "bb02", "cc03", "dd04"}


def _placement(**extra: object) -> bytes:
    doc = {"version": "v3", "db": "messages", "revision": 3, "nShards": 2,
           "replicationFactor": 2, "sites": ["AA01", "BB02", "CC03"], "leaving": ["DD04"],
           "shards": {"0": ["AA01", "BB02"], "1": ["BB02", "CC03"]}, "transitions": []}
    return json.dumps({**doc, **extra}).encode()


def test_targets_name_the_members_as_the_nodes_spell_them() -> None:
    placement = parse(_placement(), 2)
    assert placement.revision == 3
    assert placement.target(0, MEMBERS) == Target(frozenset({"aa01", "bb02"}),
                                                  frozenset({"dd04"}))
    assert placement.target(1, MEMBERS).voters == frozenset({"bb02", "cc03"})
    # The sessions database: placed nowhere, but the leaving site leaves it too.
    assert placement.target(None, MEMBERS) == Target(None, frozenset({"dd04"}))
    # A shard whose sites are all unknown here: the leader chooses.
    assert placement.target(1, {"aa01", "dd04"}).voters is None


@pytest.mark.parametrize("raw, why", [
    (b"{", "not JSON"), (b"[]", "not a placement"), (_placement(db="sessions"), "not a"),
    (_placement(nShards=16), "nShards is 16"), (_placement(shards={"x": []}), "malformed"),
    (json.dumps({"db": "messages"}).encode(), "malformed")])
def test_a_placement_the_broker_cannot_follow_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(PlacementError, match=why):
        parse(raw, 2)


def test_a_leaving_site_is_removed_even_when_it_leads() -> None:
    config = Config(frozenset({"aa01", "bb02", "dd04"}), frozenset({"cc03"}))
    target = Target(frozenset({"aa01", "bb02", "cc03"}), frozenset({"dd04"}))
    running = {"aa01", "bb02", "cc03"}
    assert next_change(config, "dd04", running, MEMBERS, {"cc03"}, 3, target) == (
        REMOVE, "dd04")
    # Once gone it is not added back as a learner; the placed learner takes the vote.
    config = Config(frozenset({"aa01", "bb02"}), frozenset({"cc03"}))
    assert next_change(config, "aa01", running | {"dd04"}, MEMBERS, {"cc03"}, 3,
                       target) == (PROMOTE, "cc03")


def test_a_voter_the_placement_moves_away_makes_room_then_returns_as_a_learner() -> None:
    target = Target(frozenset({"aa01", "cc03"}), frozenset())
    running = {"aa01", "bb02", "cc03"}
    config = Config(frozenset({"aa01", "bb02"}), frozenset({"cc03"}))
    # At the cap (2) with the placed cc03 caught up: bb02 goes...
    assert next_change(config, "aa01", running, MEMBERS, {"cc03"}, 2, target) == (
        REMOVE, "bb02")
    # ...not before cc03 can take its place,
    assert next_change(config, "aa01", running, MEMBERS, set(), 2, target) is None
    # then cc03 votes, and bb02 is back as a learner (a full replica for local reads).
    config = Config(frozenset({"aa01"}), frozenset({"cc03"}))
    assert next_change(config, "aa01", running, MEMBERS, {"cc03"}, 2, target) == (
        ADD, "bb02")
    config = Config(frozenset({"aa01"}), frozenset({"bb02", "cc03"}))
    assert next_change(config, "aa01", running, MEMBERS, {"bb02", "cc03"}, 2, target) == (
        PROMOTE, "cc03")
