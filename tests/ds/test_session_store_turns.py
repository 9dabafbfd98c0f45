"""Durable session state: the changes of one event-loop turn are one transaction, readers
see them at once, and a failed commit reaches everyone who waited on it."""

import asyncio

import pytest

from broker.session.durable import records as r
from broker.session.durable.store import SessionStore
from broker.session.durable.turn import PerTurn


def meta(expiry: int = 60) -> bytes:
    return r.Meta(expiry, 5, False, 1.0).to_bytes()


async def test_one_transaction_per_turn_for_every_session(open_storage) -> None:
    storage = open_storage()
    store = SessionStore(storage)
    commits = storage.sessions.commits
    waits = [store.write([(r.meta_key(f"c{i}"), meta())]) for i in range(5)]
    store.write_soon([(r.meta_key("c5"), meta())])
    assert len({id(w) for w in waits}) == 1  # everyone waits on the same commit
    await asyncio.gather(*waits)
    await store.settle()
    assert storage.sessions.commits == commits + 1
    assert sorted(client_id for client_id, _ in store.stored_metas()) == [f"c{i}" for i in range(6)]


async def test_a_read_in_the_same_turn_sees_the_turns_writes(open_storage) -> None:
    storage = open_storage()
    store = SessionStore(storage)
    store.write_soon([(r.meta_key("x"), meta(7))])
    loaded = store.load("x")  # no await in between: still the same turn
    assert loaded is not None and loaded.meta.expiry_interval == 7
    store.write_soon(store.delete_writes("x"))
    assert store.load("x") is None
    await store.settle()
    await storage.close()
    assert SessionStore(open_storage()).load("x") is None


async def test_the_last_change_of_a_key_in_a_turn_wins(open_storage) -> None:
    storage = open_storage()
    store = SessionStore(storage)
    store.write_soon([(r.meta_key("y"), meta(1))])
    store.write_soon([(r.meta_key("y"), meta(2))])
    await store.settle()
    await storage.close()
    loaded = SessionStore(open_storage()).load("y")
    assert loaded is not None and loaded.meta.expiry_interval == 2


async def test_a_failed_flush_fails_every_waiter_of_the_turn() -> None:
    async def failing(items: list[int]) -> None:
        raise OSError(f"disk gone after {len(items)} items")

    turn: PerTurn[int] = PerTurn(failing)
    first, second = turn.add(1), turn.extend([2, 3])
    assert first is second
    with pytest.raises(OSError, match="after 3 items"):
        await first


async def test_a_flush_refused_at_once_fails_the_waiters() -> None:
    def refusing(items: list[int]) -> asyncio.Future[None]:
        raise ValueError("refused")

    turn: PerTurn[int] = PerTurn(refusing)
    waiter = turn.add(1)
    with pytest.raises(ValueError, match="refused"):
        await waiter


async def test_work_hooked_before_the_flush_joins_the_same_commit(open_storage) -> None:
    """A once-per-turn writer (a session's acknowledgement flush) hooks itself to the
    turn's commit instead of taking a loop iteration of its own first: its writes are in
    that commit, and the turn counts as unsettled until it is made."""
    storage = open_storage()
    store = SessionStore(storage)
    commits = storage.sessions.commits
    store.before_flush(lambda: store.write_soon([(r.meta_key("hooked"), meta(3))], sync=False))
    assert store.unsettled == 1
    waiter = store.write([(r.meta_key("plain"), meta())], sync=False)
    await waiter
    assert storage.sessions.commits == commits + 1
    assert store.unsettled == 0
    loaded = store.load("hooked")
    assert loaded is not None and loaded.meta.expiry_interval == 3



async def test_replicated_a_key_written_and_deleted_in_a_turn_reaches_the_command_twice(
    open_storage,
) -> None:
    """A batch record read, handed back and done with in one turn: the replicas must see
    it written to admit the hand-back that refers to it (group_fencing.py)."""
    storage = open_storage()
    commands: list[list[tuple[bytes, bytes | None]]] = []

    async def replicate(writes: list[tuple[bytes, bytes | None]]) -> None:
        commands.append(writes)

    storage.sessions.replicate = replicate
    store = SessionStore(storage)
    key = r.batch_key("c", 1)
    store.write_soon([(key, b"record"), (r.meta_key("c"), meta())])
    store.write_soon([(key, None)])
    await store.settle()
    assert [write for command in commands for write in command if write[0] == key] == [
        (key, b"record"), (key, None)]
