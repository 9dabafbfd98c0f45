"""OCC transactions on the `sessions` database."""

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from broker.ds import Conflict, DurableStorage, PreconditionFailed, Transaction


async def _rivals(storage: DurableStorage, key: bytes, value: bytes) -> tuple[Transaction, ...]:
    """Two transactions begun after `key` was committed as `value`: each will read it and
    write it, so whichever commits second conflicts."""
    seed = storage.begin()
    seed.put(key, value)
    await storage.commit(seed)
    return storage.begin(), storage.begin()


async def test_commit_is_durable_and_atomic(open_storage) -> None:
    storage = open_storage()
    tx = storage.begin()
    tx.put(b"s/a", b"1")
    tx.put(b"s/b", b"2")
    tx.delete(b"s/none")
    await storage.commit(tx)
    await storage.close()
    storage = open_storage()
    assert storage.sessions.scan(b"s/") == [(b"s/a", b"1"), (b"s/b", b"2")]


async def test_read_then_concurrent_write_conflicts(open_storage) -> None:
    storage = open_storage()
    first, second = await _rivals(storage, b"counter", b"0")
    for tx in (first, second):
        tx.put(b"counter", b"%d" % (int(tx.get(b"counter")) + 1))
    await storage.commit(first)
    with pytest.raises(Conflict):
        await storage.commit(second)
    retry = storage.begin()  # the caller retries from the start and sees the winner
    retry.put(b"counter", b"%d" % (int(retry.get(b"counter")) + 1))
    await storage.commit(retry)
    assert storage.sessions.get(b"counter") == b"2"


async def test_a_blind_write_conflicts_with_a_transaction_that_read_its_key(
    open_storage,
) -> None:
    """`write_soon` skips the transaction, not the conflict log: a transaction open meanwhile
    that read the key must not commit over it."""
    storage = open_storage()
    reader, _ = await _rivals(storage, b"k", b"0")
    reader.put(b"k", reader.get(b"k") + b"+")
    await storage.sessions.write_soon({b"k": b"blind"})
    with pytest.raises(Conflict):
        await storage.commit(reader)
    assert storage.sessions.get(b"k") == b"blind"


async def test_blind_writes_and_disjoint_reads_do_not_conflict(open_storage) -> None:
    storage = open_storage()
    one, two = storage.begin(), storage.begin()
    one.get(b"a")
    one.put(b"a", b"1")
    two.get(b"b")
    two.put(b"b", b"2")
    two.put(b"a", b"blind")
    await storage.commit(two)
    with pytest.raises(Conflict):  # `one` read a, which `two` wrote
        await storage.commit(one)
    three = storage.begin()
    three.get(b"c")
    four = storage.begin()
    four.put(b"d", b"x")
    await storage.commit(four)
    three.put(b"c", b"y")
    await storage.commit(three)


async def test_prefix_reads_conflict_with_new_keys_under_the_prefix(open_storage) -> None:
    storage = open_storage()
    gc = storage.begin()
    assert gc.scan(b"session/") == []
    writer = storage.begin()
    writer.put(b"session/x", b"{}")
    await storage.commit(writer)
    gc.put(b"gc/last", b"now")
    with pytest.raises(Conflict):
        await storage.commit(gc)


async def attempt(storage, require: str, *args: bytes) -> bool:
    """Commits a transaction that writes `other` under one precondition; whether it held."""
    tx = storage.begin()
    getattr(tx, require)(*args)
    tx.put(b"other", args[-1])
    try:
        await storage.commit(tx)
    except PreconditionFailed:
        return False
    return True


async def test_preconditions(open_storage) -> None:
    storage = open_storage()
    assert not await attempt(storage, "require_exists", b"k")
    assert storage.sessions.get(b"other") is None  # nothing of a failed commit is written
    assert await attempt(storage, "require_absent", b"k")
    seed = storage.begin()
    seed.put(b"k", b"v1")
    await storage.commit(seed)
    assert not await attempt(storage, "require_absent", b"k")
    assert await attempt(storage, "require_exists", b"k")
    assert await attempt(storage, "require_value", b"k", b"v1")
    assert not await attempt(storage, "require_value", b"k", b"v2")
    assert storage.sessions.get(b"other") == b"v1"


async def test_concurrent_increments_lose_nothing(open_storage) -> None:
    """Many writers, one key: every increment lands exactly once through retries."""
    storage = open_storage()

    async def increment() -> int:
        attempts = 0
        while True:
            attempts += 1
            tx = storage.begin()
            value = int(tx.get(b"n") or b"0")
            await asyncio.sleep(0)  # let the others interleave between read and commit
            tx.put(b"n", b"%d" % (value + 1))
            try:
                await storage.commit(tx)
                return attempts
            except Conflict:
                continue

    attempts = await asyncio.gather(*(increment() for _ in range(20)))
    assert storage.sessions.get(b"n") == b"20"
    assert max(attempts) > 1  # contention really happened


async def test_commit_soon_is_validated_and_visible_at_once(open_storage) -> None:
    """Staged without a coroutine: a conflict is raised by the call itself, and readers see
    the writes before the returned future says they are on disk."""
    storage = open_storage()
    first, second = await _rivals(storage, b"k", b"0")
    for tx in (first, second):
        tx.put(b"k", tx.get(b"k") + b"+")
    written = storage.commit_soon(first)
    assert storage.sessions.get(b"k") == b"0+"  # visible before it is durable
    with pytest.raises(Conflict):
        storage.commit_soon(second)
    await written
    await storage.close()
    assert open_storage().sessions.get(b"k") == b"0+"


async def test_a_write_without_fsync_is_in_leveldb_when_the_call_returns(open_storage) -> None:
    """Nothing ahead of it: it is written by the call itself (its future already done), so
    a kill -9 right after cannot lose it, and reopening finds it."""
    storage = open_storage()
    written = storage.sessions.write_soon({b"a": b"1", b"gone": None}, sync=False)
    assert written.done() and written.exception() is None
    assert storage.sessions._db.get(b"a") == b"1"  # in LevelDB, not only in the overlay
    await storage.close()
    assert open_storage().sessions.get(b"a") == b"1"


async def test_a_write_without_fsync_goes_after_a_synced_write_still_on_its_way(
    open_storage,
) -> None:
    """A write issued later must land later, or the older value would overwrite it."""
    storage = open_storage(flush_interval=0.05, idle_flush_interval=0.05)
    synced = storage.sessions.write_soon({b"k": b"old"}, sync=True)
    later = storage.sessions.write_soon({b"k": b"new"}, sync=False)
    assert not synced.done() and not later.done()  # queued behind the synced write
    assert storage.sessions.get(b"k") == b"new"  # readers see the latest already
    await asyncio.gather(synced, later)
    assert storage.sessions.get(b"k") == b"new"
    await storage.close()
    assert open_storage().sessions.get(b"k") == b"new"


async def test_a_write_without_fsync_right_after_a_flush_shadows_nothing(open_storage) -> None:
    """A flush's overlay entries go in a callback on a later event-loop turn; a write made
    in between (here by a callback queued ahead of that one) is read back, not the older
    value still in the overlay."""
    storage = open_storage(max_items=1)  # a synced write starts flushing at once
    kv = storage.sessions
    loop = asyncio.get_running_loop()
    seen: list[bytes | None] = []
    checked = asyncio.Event()

    def write_new() -> None:
        kv.write_soon({b"k": b"new"}, sync=False)
        seen.append(kv.get(b"k"))
        checked.set()

    synced = kv.write_soon({b"x": b"0"}, sync=True)
    old = kv.write_soon({b"k": b"old"}, sync=False)  # queued behind the synced flush
    assert not old.done()
    # Runs after the flush of `old` ends and before its overlay entry is dropped.
    synced.add_done_callback(lambda _: loop.call_soon(write_new))
    await checked.wait()
    await old
    assert seen == [b"new"]
    assert kv.get(b"k") == b"new"


async def test_the_sessions_database_is_described_without_reading_every_key(
        open_storage: Callable[..., DurableStorage]) -> None:
    """The dashboard asks for it every second: a million sessions must not be read each
    time, on the event loop."""
    storage = open_storage()
    sessions = storage.sessions
    sessions.apply([(b"s%06d" % i, bytes(100)) for i in range(20_000)], [])
    real = sessions._db

    class Unscannable:
        def __getattr__(self, name: str) -> Any:
            if name == "iterator":
                raise AssertionError("info() read the keys")
            return getattr(real, name)

    sessions._db = Unscannable()
    try:
        info = sessions.info()
    finally:
        sessions._db = real
    assert info["name"] == "sessions" and info["commits"] == sessions.commits
    real.compact_range()
    assert sessions.info()["bytes"] > 0


async def test_a_scan_overlays_the_writes_on_their_way_under_its_prefix_only(
        open_storage: Callable[..., DurableStorage]) -> None:
    """Writes still on their way (synced, not yet on disk) are read with what is on disk:
    those under the prefix, a delete hiding a stored key; neighbouring prefixes (`s\\0a`
    and `s\\0ab`) are kept apart, and once written the overlay entries are gone."""
    storage = open_storage(flush_interval=0.05, idle_flush_interval=0.05)
    kv = storage.sessions
    kv.apply([(b"s\0a\0x", b"disk"), (b"s\0a\0y", b"disk"), (b"s\0ab\0z", b"disk")], [])
    written = kv.write_soon({b"s\0a\0w": b"new", b"s\0a\0y": None, b"s\0ab\0a": b"new",
                             b"r\0a\0k": b"new", b"t\0a\0k": b"new"})
    newer = kv.write_soon({b"s\0a\0x": b"newer"})
    assert not written.done()
    expected = [(b"s\0a\0w", b"new"), (b"s\0a\0x", b"newer")]
    assert kv.scan(b"s\0a\0") == expected
    assert kv.scan(b"s\0ab\0") == [(b"s\0ab\0a", b"new"), (b"s\0ab\0z", b"disk")]
    assert kv.scan(b"s\0") == [*expected, (b"s\0ab\0a", b"new"), (b"s\0ab\0z", b"disk")]
    await asyncio.gather(written, newer)  # each removes its entries before its waiters run
    assert kv._pending.under(b"") == []
    assert kv.scan(b"s\0a\0") == expected
