"""Batches handed back to a durable group, taken by the shard's owner (groups.py): with
replicated storage only once a barrier through the messages shard's log has passed on the
owner's node, and only those handed back before it was proposed (the messages they name
are then in this node's replica); with local storage at once. And a replica replaced by a
snapshot: the members served on its node look at their shards again."""

import asyncio
from collections.abc import Collection
from types import SimpleNamespace
from typing import Any

import pytest

from broker.session.durable import group_records as g
from broker.session.durable import groups
from broker.session.durable import records as r
from broker.session.durable.groups import READY, Group, GroupManager
from broker.stats import Stats

SHARE = "$share/g/jobs/#"


class FakeStore:
    """The handed-back batches of the share's shard 0, by key."""

    def __init__(self) -> None:
        self.returned: list[bytes] = []

    def load_returned(self, share: str, shard: int) -> list[tuple[bytes, Any]]:
        return [(key, None) for key in self.returned]

    def groups(self) -> tuple[dict[str, int], dict[str, dict[int, g.Owner]], list[bytes]]:
        """m1 and m2 members, m1 reading shard 0."""
        return ({SHARE: 1}, {SHARE: {0: g.Owner("m1", g.OWN)}},
                [r.subscription_key(member, SHARE) for member in ("m1", "m2")])


class Taker:
    """A connected durable member served here; what it takes leaves the store. Standing in
    for the durable session class the manager checks for (`_durable_sessions_are_takers`):
    a compiled class cannot be subclassed by an interpreted one."""

    def __init__(self, store: FakeStore, client_id: str = "m1") -> None:
        self.client_id = client_id
        self.epoch = 0
        self.connection = object()
        self.store = store
        self.taken: list[set[bytes] | None] = []
        self.refreshed = 0

    def refresh_streams(self) -> None:
        self.refreshed += 1

    def adopt_returned(self, key: str, shard: int,
                       among: Collection[bytes] | None = None) -> None:
        taking = set(self.store.returned) if among is None else set(among)
        self.store.returned = [k for k in self.store.returned if k not in taking]
        self.taken.append(None if among is None else taking)


@pytest.fixture(autouse=True)
def _durable_sessions_are_takers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groups, "DurableSession", Taker)


def manager_of(store: FakeStore, taker: Taker) -> GroupManager:
    ds = SimpleNamespace(messages=SimpleNamespace(n_shards=4))
    manager = GroupManager(ds, store, Stats(), {"m1": taker},  # type: ignore[arg-type]
                           lambda _: READY, True)
    manager.groups[SHARE] = Group(1, {"m1"}, {0: g.Owner("m1", g.OWN)})
    return manager


async def test_batches_are_taken_once_a_barrier_through_the_shard_passed() -> None:
    store = FakeStore()
    taker = Taker(store)
    manager = manager_of(store, taker)
    barriers: list[tuple[int, asyncio.Future[bool]]] = []

    def barrier(shard: int) -> asyncio.Future[bool]:
        barriers.append((shard, asyncio.get_running_loop().create_future()))
        return barriers[-1][1]

    manager.shard_barrier = barrier
    store.returned = [b"x1"]
    manager.offer_returned(SHARE, 0)
    await asyncio.sleep(0)
    assert [shard for shard, _ in barriers] == [0] and taker.taken == []
    store.returned.append(b"x2")  # handed back after the barrier was proposed
    manager.offer_returned(SHARE, 0)
    await asyncio.sleep(0)
    assert len(barriers) == 1  # one at a time
    barriers[0][1].set_result(True)
    await asyncio.sleep(0)
    assert taker.taken == [{b"x1"}]  # x2's messages may not be here yet
    await asyncio.sleep(0)
    assert len(barriers) == 2
    barriers[1][1].set_result(True)
    await asyncio.sleep(0)
    assert taker.taken == [{b"x1"}, {b"x2"}] and store.returned == []
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(barriers) == 2 and not manager._tasks  # nothing more came back: done


async def test_a_shard_that_moved_on_while_its_barrier_failed_is_not_taken() -> None:
    store = FakeStore()
    taker = Taker(store)
    manager = manager_of(store, taker)
    failed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    manager.shard_barrier = lambda shard: failed
    store.returned = [b"x1"]
    manager.offer_returned(SHARE, 0)
    await asyncio.sleep(0)
    manager.groups[SHARE].owners[0] = g.Owner(None, g.FREE)  # its next owner takes them
    failed.set_result(False)  # cut off from the shard's majority
    for _ in range(3):
        await asyncio.sleep(0)
    assert taker.taken == [] and store.returned == [b"x1"] and not manager._tasks


def test_with_local_storage_they_are_taken_at_once() -> None:
    store = FakeStore()
    taker = Taker(store)
    manager = manager_of(store, taker)
    store.returned = [b"x1"]
    manager.offer_returned(SHARE, 0)
    assert taker.taken == [None] and store.returned == []


def test_a_snapshot_applied_has_the_members_served_here_look_at_their_shards_again() -> None:
    store = FakeStore()
    served = {client_id: Taker(store, client_id) for client_id in ("m1", "m2")}
    ds = SimpleNamespace(messages=SimpleNamespace(n_shards=4))
    manager = GroupManager(ds, store, Stats(), served,  # type: ignore[arg-type]
                           lambda _: READY, True)
    manager.load()
    assert manager.groups[SHARE].members == {"m1", "m2"}
    # m1 reads shard 0 (perhaps in a new tenure), m2 perhaps lost what it read: each looks
    # again (its shards are read once checked, `readable`).
    assert [session.refreshed for session in served.values()] == [1, 1]
