"""The administrator's replica sites (broker ctl ds join | leave | set-replicas) and how a
shard's leader steers towards them."""

import pytest

from broker.cluster import ds_replicas
from broker.cluster.group_members import ADD, PROMOTE, REMOVE, next_change
from broker.raft.messages import Config

MEMBERS = {"a1", "b2", "c3"}


def test_no_choice_lets_every_member_vote_and_leave_starts_from_all_of_them() -> None:
    assert ds_replicas.replicas(None, MEMBERS) == ["a1", "b2", "c3"]
    assert ds_replicas.target(None, MEMBERS).voters is None
    assert ds_replicas.leave(None, "C3", MEMBERS) == {"a1", "b2"}  # any case, as spelled


def test_join_set_and_refusals() -> None:
    assert ds_replicas.join(frozenset({"a1"}), "b2", MEMBERS) == {"a1", "b2"}
    assert ds_replicas.set_replicas(["A1", "c3"], MEMBERS) == {"a1", "c3"}
    with pytest.raises(ds_replicas.ReplicasRefused, match="not a member"):
        ds_replicas.join(None, "zz", MEMBERS)
    with pytest.raises(ds_replicas.ReplicasRefused, match="at least one"):
        ds_replicas.set_replicas([], MEMBERS)
    with pytest.raises(ds_replicas.ReplicasRefused, match="last site"):
        ds_replicas.leave(frozenset({"a1"}), "a1", MEMBERS)


def test_the_choice_round_trips_and_a_damaged_value_reads_as_none() -> None:
    chosen = frozenset({"b2", "a1"})
    assert ds_replicas.decode(ds_replicas.encode(chosen)) == chosen
    assert ds_replicas.decode(b"{not json") is None
    assert ds_replicas.decode(None) is None
    # A departed member no longer counts, nor does it empty the target.
    assert ds_replicas.target(frozenset({"a1", "gone"}), MEMBERS).voters == {"a1"}
    assert ds_replicas.target(frozenset({"gone"}), MEMBERS).voters is None


def test_a_voter_that_leaves_gives_up_its_vote_even_with_no_replacement() -> None:
    """3 voters, the choice keeps 2: no learner can take the third's place, so it is
    removed at once (and comes back as a learner); with a chosen learner waiting, only
    once that one has caught up."""
    config = Config(frozenset(MEMBERS))
    target = ds_replicas.target(frozenset({"a1", "b2"}), MEMBERS)
    assert next_change(config, "a1", {"b2", "c3"}, MEMBERS, set(), 3, target) == (REMOVE, "c3")
    shrunk = Config(frozenset({"a1", "b2"}))
    assert next_change(shrunk, "a1", {"b2", "c3"}, MEMBERS, set(), 3, target) == (ADD, "c3")
    members = MEMBERS | {"d4"}
    swap = ds_replicas.target(frozenset({"a1", "b2", "d4"}), members)
    with_learner = Config(frozenset(MEMBERS), frozenset({"d4"}))
    running = {"b2", "c3", "d4"}
    assert next_change(with_learner, "a1", running, members, set(), 3, swap) is None
    assert next_change(with_learner, "a1", running, members, {"d4"}, 3, swap) == (
        REMOVE, "c3")
    after = Config(frozenset({"a1", "b2"}), frozenset({"d4"}))
    assert next_change(after, "a1", running, members, {"d4"}, 3, swap) == (ADD, "c3")
    learners = Config(frozenset({"a1", "b2"}), frozenset({"c3", "d4"}))
    assert next_change(learners, "a1", running, members, {"c3", "d4"}, 3, swap) == (
        PROMOTE, "d4")
