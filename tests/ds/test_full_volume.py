"""Durable Storage on a volume that fills up (a 32 MiB tmpfs of its own, mounted here as
root): a write that fails for lack of space closes the gate (later writes refused at once,
StorageRefused), reads go on, and once space is freed the storage reopens the LevelDBs the
failure left refusing and takes writes again; every write that succeeded is there after a
reopen of the whole storage, and nothing written after the gate reopened is lost either."""

from collections.abc import Iterator
from pathlib import Path

import plyvel
import pytest

from broker.ds import DurableStorage, Settings
from broker.ds.space import DISK_FULL, StorageRefused
from broker.ds.storage import MESSAGES
from tests.ds.conftest import message, read_all
from tests.support.full_disk import fill, tmpfs

PAYLOAD = bytes(4096)


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "volume", 32) as mounted:
        yield mounted


async def _store_until_refused(storage: DurableStorage, first: int) -> list[int]:
    """Stores messages numbered from `first`, one batch each, until one fails; returns
    those stored."""
    stored: list[int] = []
    for number in range(first, first + 100_000):
        try:
            await storage.store_batch(MESSAGES, [message(f"f/{number}", payload=PAYLOAD)])
        except (plyvel.Error, OSError, StorageRefused):
            return stored
        stored.append(number)
    raise AssertionError("the volume never filled")


async def test_writes_fail_then_resume_once_space_is_freed(volume: Path) -> None:
    data = volume / "data"
    storage = DurableStorage(data, Settings(n_shards=1, flush_interval=0.001))
    closed = False
    try:
        events: list[tuple[str, bool]] = []
        storage.space.listeners.append(
            lambda reason, text, details: events.append((reason, text is not None)))
        filler = fill(volume, 6)
        stored = await _store_until_refused(storage, 0)
        assert stored and events == [(DISK_FULL, True)]
        with pytest.raises(StorageRefused):  # at once, without touching LevelDB
            storage.store_batch(MESSAGES, [message("refused", payload=b"x")])
        # The sessions database's writes fail as well, and are reported the same way.
        with pytest.raises((plyvel.Error, OSError)):
            for i in range(10_000):
                await storage.sessions.write_soon({f"s{i}".encode(): PAYLOAD}, sync=True)
        assert len(read_all(storage, "f/#")) >= len(stored)  # reads go on

        await storage.watch_space()  # still full: nothing changes
        assert events == [(DISK_FULL, True)]
        filler.unlink()
        await storage.watch_space()
        assert events == [(DISK_FULL, True), (DISK_FULL, False)]
        more = await _store_until_refused_or(storage, 1_000_000, 50)
        await storage.sessions.write_soon({b"after": b"x"}, sync=True)
        await storage.close()
        closed = True

        storage = DurableStorage(data, Settings(n_shards=1, flush_interval=0.001))
        closed = False
        numbers = {int(m.topic.split("/")[1]) for m in read_all(storage, "f/#")}
        assert set(stored) | set(more) <= numbers
        assert storage.sessions.get(b"after") == b"x"
    finally:
        if not closed:
            await storage.close()


async def _store_until_refused_or(storage: DurableStorage, first: int, count: int
                                  ) -> list[int]:
    for number in range(first, first + count):
        await storage.store_batch(MESSAGES, [message(f"f/{number}", payload=PAYLOAD)])
    return list(range(first, first + count))
