"""Missed-message counts of offline durable sessions, on a real Durable Storage: counted from
the disconnect, carried on across polls and generations, capped, and begun again when the
client comes and goes."""

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from broker.ds import TTV, DurableStorage, Settings
from broker.ds.storage import MESSAGES
from broker.http.missed import MissedCounts
from broker.session.durable.session import DurableSession


@dataclass
class AwaySession:
    """What MissedCounts reads of a DurableSession."""

    client_id: str = "away"
    connection: Any = None
    disconnected_at: float | None = None
    subscriptions: dict[str, Any] = field(default_factory=dict)
    since: dict[str, int | None] = field(default_factory=dict)


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
    session = AwaySession(subscriptions={"a/#": None, "$share/g/a/#": None},
                          since={"a/#": 0, "$share/g/a/#": None})
    session.disconnected_at = time.time()
    counts = MissedCounts(storage, cap=8)
    away = cast(DurableSession, session)
    assert counts.count(away) == 0
    await store(storage, "a/1", "a/2", "b/1")
    assert counts.count(away) == 2
    await store(storage, "a/3")
    await storage.seal()
    await store(storage, "a/4", "a/5")
    assert counts.count(away) == 5
    await store(storage, *(f"a/more/{n}" for n in range(10)))
    assert counts.count(away) == 8  # the cap
    session.connection = object()
    assert counts.count(away) == 0
    session.connection, session.disconnected_at = None, time.time()
    await store(storage, "a/6")
    assert counts.count(away) == 1  # a new absence, a new count

