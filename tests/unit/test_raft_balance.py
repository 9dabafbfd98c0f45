"""The leadership balancing plan (broker/raft/balance.py): pure, on the views one node has."""

from broker.raft.balance import Groups, leader_counts, moves

ABC = frozenset("abc")


def _led(*leaders: str | None) -> Groups:
    return {group: (leader, ABC) for group, leader in enumerate(leaders)}


def test_a_node_leading_everything_after_a_rolling_restart_hands_out_all_but_its_share() -> None:
    groups = _led(*"aaaaaa")
    planned = moves("a", groups, lambda voter: True)
    assert len(planned) == 4
    after = leader_counts({**groups, **{g: (t, ABC) for g, t in planned}})
    assert after == {"a": 2, "b": 2, "c": 2}


def test_a_fair_share_or_a_difference_of_one_moves_nothing() -> None:
    assert moves("a", _led(*"aabbcc"), lambda voter: True) == []
    assert moves("a", _led(*"aabbc"), lambda voter: True) == []
    assert moves("a", _led(*"aaabbc"), lambda voter: True) == [(0, "c")]


def test_only_groups_it_leads_go_and_only_to_their_voters_that_may_lead() -> None:
    groups = {0: ("a", frozenset("ab")), 1: ("a", frozenset("ab")), 2: ("a", frozenset("ac")),
              3: ("c", frozenset("ac"))}
    assert moves("a", groups, lambda voter: True) == [(0, "b")]
    assert moves("a", groups, lambda voter: voter != "b") == [(2, "c")]
    assert moves("b", groups, lambda voter: True) == []


def test_groups_without_a_leader_count_for_nobody() -> None:
    assert leader_counts(_led("a", None, "a")) == {"a": 2, "b": 0, "c": 0}
    assert moves("a", _led("a", None, "a"), lambda voter: True) == [(0, "b")]
