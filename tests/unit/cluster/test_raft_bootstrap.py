"""Who creates the metadata group, with which voters, and how its leader follows the member
list: the pure decisions, one rule per test."""

from broker.cluster.bootstrap import MEMBER, PENDING, UNKNOWN, VOTER_CAP, Bootstrap, GroupRecord
from broker.cluster.group_members import ADD, PROMOTE, REMOVE, next_change
from broker.raft.messages import Config


def test_a_single_node_creates_its_group_once_joined() -> None:
    alone = Bootstrap("a", 1)
    assert alone.attempt(set(), joined=False, epoch=7) is None
    attempt = alone.attempt(set(), joined=True, epoch=7)
    assert attempt is not None and attempt.voters == ("a",) and attempt.peers == ()
    assert alone.attempt_done(attempt, True) == GroupRecord(7, ("a",))
    assert alone.state == MEMBER and alone.attempt(set(), True, 8) is None


def test_only_the_smallest_site_coordinates_once_n_sites_run() -> None:
    assert Bootstrap("b", 3).attempt({"a", "c"}, True, 1) is None  # a coordinates
    assert Bootstrap("a", 3).attempt({"b"}, True, 1) is None  # 2 of 3 running
    attempt = Bootstrap("a", 3).attempt({"b", "c", "d"}, True, 1)
    assert attempt is not None
    assert attempt.voters == ("a", "b", "c") and attempt.peers == ("b", "c", "d")


def test_voters_are_capped() -> None:
    sites = {f"s{i}" for i in range(1, 9)}
    attempt = Bootstrap("s0", 8).attempt(sites, True, 1)
    assert attempt is not None and len(attempt.voters) == VOTER_CAP


def test_a_promise_excludes_other_coordinators_until_decided() -> None:
    peer = Bootstrap("c", 3)
    assert peer.prepare(1, "a", ("a", "b", "c")) == ""
    assert "promised to a" in peer.prepare(2, "b", ("b", "c", "d"))
    assert peer.attempt({"x"}, True, 3) is None  # a promised node never coordinates
    assert peer.adopt(2) is None  # nor joins another epoch's traffic
    # The same coordinator's newer attempt replaces its older one.
    assert peer.prepare(4, "a", ("a", "b", "c")) == ""
    assert peer.decided(1, True) is None  # a stale outcome
    assert peer.decided(4, True) == GroupRecord(4, ("a", "b", "c"))
    assert "member" in peer.prepare(5, "a", ("a",))


def test_an_aborted_or_unknown_attempt_releases_the_promise() -> None:
    peer = Bootstrap("c", 3)
    peer.prepare(1, "a", ("a", "b", "c"))
    assert peer.decided(1, False) is None and peer.state == "blank"
    peer.prepare(2, "a", ("a", "b", "c"))
    assert not peer.release_orphaned({"a", "b"})
    assert peer.release_orphaned({"b"}) and peer.state == "blank"  # a was removed


def test_a_promised_node_that_is_no_voter_waits_to_be_added() -> None:
    peer = Bootstrap("d", 3)
    peer.prepare(1, "a", ("a", "b", "c"))
    assert peer.decided(1, True) is None and peer.state == "blank"
    assert peer.adopt(1) == GroupRecord(1)


def test_the_coordinator_answers_how_its_attempt_ended() -> None:
    coordinator = Bootstrap("a", 2)
    attempt = coordinator.attempt({"b"}, True, 9)
    assert attempt is not None
    assert coordinator.status(9) == PENDING
    assert coordinator.prepare(3, "z", ("z",)) != ""  # busy with its own
    coordinator.attempt_done(attempt, True)
    assert coordinator.status(9) == MEMBER and coordinator.status(8) == UNKNOWN
    refused = Bootstrap("a", 2)
    attempt = refused.attempt({"b"}, True, 10)
    assert attempt is not None and refused.attempt_done(attempt, False) is None
    assert refused.status(10) == UNKNOWN and refused.state == "blank"


def test_the_state_survives_a_restart() -> None:
    peer = Bootstrap("c", 3)
    peer.prepare(1, "a", ("a", "b", "c"))
    again = Bootstrap.from_json("c", 3, peer.to_json())
    assert again.promise == peer.promise and again.record is None
    again.decided(1, True)
    assert Bootstrap.from_json("c", 3, again.to_json()).record == GroupRecord(1, ("a", "b", "c"))


def test_the_leader_removes_gone_members_first_then_adds_then_promotes() -> None:
    config = Config(frozenset({"a", "b", "c"}), frozenset({"d"}))
    # c left the cluster (no longer known), e is new and running, d caught up.
    assert next_change(config, "a", {"b", "d", "e"}, {"a", "b", "d", "e"}, {"d"}) == (
        REMOVE, "c")
    config = Config(frozenset({"a", "b"}), frozenset({"d"}))
    assert next_change(config, "a", {"b", "d", "e"}, {"a", "b", "d", "e"}, {"d"}) == (
        ADD, "e")
    config = Config(frozenset({"a", "b"}), frozenset({"d", "e"}))
    assert next_change(config, "a", {"b", "d", "e"}, {"a", "b", "d", "e"}, {"d"}) == (
        PROMOTE, "d")
    # A down member stays (autoclean or force-leave decides), a lagging learner waits.
    assert next_change(config, "a", {"b"}, {"a", "b", "d", "e"}, {"d", "e"}) is None
    assert next_change(config, "a", {"b", "d", "e"}, {"a", "b", "d", "e"}, set()) is None


def test_beyond_the_cap_members_stay_learners() -> None:
    voters = frozenset({"a", "b", "c", "d", "e"})
    config = Config(voters, frozenset({"f"}))
    assert len(voters) == VOTER_CAP
    assert next_change(config, "a", set(voters | {"f"}) - {"a"}, set(voters | {"f"}),
                       {"f"}) is None
