"""Missed-message counts of offline durable sessions, on a real Durable Storage: counted from
the disconnect, carried on across polls and generations, capped, and begun again when the
client comes and goes."""

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.ds import TTV, DurableStorage, Settings
from broker.ds.storage import MESSAGES
from broker.http.missed import MissedCounts


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[DurableStorage]:
    opened = DurableStorage(tmp_path, Settings(n_shards=2, flush_interval=0.001))
    yield opened
    await opened.close()


async def store(storage: DurableStorage, *topics: str) -> None:
    await storage.store_batch(MESSAGES, [TTV(t, b"x", 1, False, f"pub-{t}") for t in topics])


async def test_counts_from_the_disconnect_across_polls_and_generations(
        storage: DurableStorage) -> None:
    await store(storage, "a/before")
    since = {"a/#": 0}
    away_since = time.time()
    counts = MissedCounts(storage, cap=8)
    assert counts.count("away", away_since, since) == 0
    await store(storage, "a/1", "a/2", "b/1")
    assert counts.count("away", away_since, since) == 2
    await store(storage, "a/3")
    await storage.seal()
    await store(storage, "a/4", "a/5")
    assert counts.count("away", away_since, since) == 5
    await store(storage, *(f"a/more/{n}" for n in range(10)))
    assert counts.count("away", away_since, since) == 8  # the cap
    assert counts.count("away", None, since) == 0  # back
    away_since = time.time()
    await store(storage, "a/6")
    assert counts.count("away", away_since, since) == 1  # a new absence, a new count

