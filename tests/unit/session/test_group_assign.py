"""The spread of a durable group's shards over its connected members (group_assign.py)."""

from collections import Counter

import pytest

from broker.session.durable.group_assign import rebalance
from broker.session.durable.group_records import FREE, OWN, REVOKE, Owner

N = 16


def apply(owners: dict[int, Owner], changes: list[tuple[int, Owner | None, Owner]]) -> None:
    for shard, stored, new in changes:
        assert owners.get(shard) == stored  # a change names what it replaces
        owners[shard] = new


def settle(owners: dict[int, Owner], connected: set[str], n: int = N) -> dict[int, Owner]:
    """Rebalances until nothing changes, the members' nodes freeing what they are asked to."""
    for _ in range(10):
        changes = rebalance(n, owners, connected)
        if not changes:
            return owners
        apply(owners, changes)
        for shard, owner in list(owners.items()):
            if owner.state == REVOKE:
                owners[shard] = Owner(None, FREE)
    raise AssertionError("did not settle")


def loads(owners: dict[int, Owner]) -> Counter[str]:
    return Counter(o.client for o in owners.values() if o.state == OWN and o.client)


@pytest.mark.parametrize("members", [1, 2, 3, 4, 5, 16, 20])
def test_every_shard_goes_to_a_connected_member_evenly(members: int) -> None:
    connected = {f"m{i}" for i in range(members)}
    owners = settle({}, connected)
    assert sorted(owners) == list(range(N))
    counts = [loads(owners)[member] for member in connected]
    assert sum(counts) == N
    assert max(counts) - min(counts) <= 1 if members <= N else max(counts) == 1


def test_a_joining_member_takes_shards_only_after_they_were_let_go() -> None:
    owners = settle({}, {"a"})
    changes = rebalance(N, owners, {"a", "b"})
    # First only asks "a" to let go: nothing is handed to "b" while "a" may read it.
    assert {new.state for _, _, new in changes} == {REVOKE}
    assert all(new.client == "a" for _, _, new in changes)
    assert loads(settle(owners, {"a", "b"})) == Counter({"a": 8, "b": 8})


def test_shards_of_a_member_gone_move_at_once_the_others_keep_theirs() -> None:
    owners = settle({}, {"a", "b", "c", "d"})
    before = {shard: o.client for shard, o in owners.items()}
    changes = rebalance(N, owners, {"a", "b", "c"})
    assert {stored.client for _, stored, _ in changes if stored} == {"d"}
    assert all(new.state == OWN and new.client != "d" for _, _, new in changes)
    apply(owners, changes)
    assert all(owners[s].client == c for s, c in before.items() if c != "d")


def test_with_no_member_connected_nothing_moves() -> None:
    owners = settle({}, {"a", "b"})
    assert rebalance(N, owners, set()) == []


def test_a_shard_being_let_go_is_not_handed_out() -> None:
    owners = {shard: Owner("a", OWN) for shard in range(N)}
    owners[3] = Owner("a", REVOKE)
    changes = rebalance(N, owners, {"a", "b"})
    assert 3 not in {shard for shard, _, _ in changes}


@pytest.mark.parametrize("n", [4, 5, 16])
def test_members_joining_one_by_one_end_up_even(n: int) -> None:
    """The last to join gets its share even when the others already hold the most any
    member may (4 shards, 3 members: 2, 1, 1, not 2, 2, 0)."""
    owners: dict[int, Owner] = {}
    joined: set[str] = set()
    for member in ["c", "a", "d", "b"]:
        joined.add(member)
        settle(owners, joined, n)
        counts = [loads(owners)[m] for m in joined]
        assert sum(counts) == n and max(counts) - min(counts) <= 1, (member, counts)


def test_with_more_members_than_shards_free_shards_go_to_those_holding_none_by_name() -> None:
    """A group of thousands: the members holding a shard keep it, one each; the shards left
    free go one each to members holding none, the first by name; the rest get nothing."""
    members = {f"m{i:04d}" for i in range(1000)}
    owners = {shard: Owner(f"m{999 - shard:04d}", OWN) for shard in range(10)}
    owners[0] = Owner("m0999", OWN)
    owners[1] = Owner("m0999", OWN)  # one too many: let go
    owners[2] = Owner("gone", OWN)  # its member left: handed out at once
    changes = rebalance(N, owners, members)
    assert [(shard, new) for shard, _, new in changes if new.state == REVOKE] == [
        (1, Owner("m0999", REVOKE))]
    handed = sorted((shard, new.client) for shard, _, new in changes if new.state == OWN)
    assert handed == [(2, "m0000"), *((shard, f"m{shard - 9:04d}") for shard in range(10, N))]
