"""VersionKeeper.until: a request waits for a rise every member's code is ready for, and
only then (its metadata group and cluster stood in for by their few fields it reads)."""

import asyncio
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from broker.cluster import version_keeper, versions
from broker.cluster.version_keeper import VersionKeeper

OLD = versions.Speaks("0.1.0", 0, 0)


class _Cluster:
    def __init__(self, speaks: dict[str, versions.Speaks | None]) -> None:
        self._speaks = speaks

    def speaks(self, site: str) -> versions.Speaks | None:
        return self._speaks[site]

    def group_sites(self) -> set[str]:
        return set()

    def refuse_older(self, effective: int) -> None:
        pass


def _keeper(speaks: dict[str, versions.Speaks | None],
            record: Callable[[int], None] = lambda version: None
            ) -> tuple[VersionKeeper, Any]:
    machine = SimpleNamespace(cluster_version=0)
    metadata = SimpleNamespace(machine=machine, member_sites=lambda: set(speaks),
                               core=lambda: None)  # not the leader: nothing proposed here
    return VersionKeeper(metadata, _Cluster(speaks), record), machine  # type: ignore[arg-type]


async def test_the_version_is_recorded_at_start_and_at_each_rise() -> None:
    """Where start-up refuses code that cannot run it (format_check.record_cluster_version,
    which writes only a version above the one recorded): a rise on a worker thread, off
    the event loop, in the order of the rises; a stop waits for it."""
    recorded: list[int] = []
    loop = threading.get_ident()
    threads: list[int] = []

    def record(version: int) -> None:
        threads.append(threading.get_ident())
        recorded.append(version)

    keeper, machine = _keeper({"a": versions.MINE}, record)
    assert recorded == [0] and threads == [loop]
    keeper.round()
    machine.cluster_version = versions.HIGHEST - 1  # two rises, applied here
    keeper.round()
    machine.cluster_version = versions.HIGHEST
    keeper.round()
    keeper.round()
    await keeper.stop()
    assert recorded == [0, versions.HIGHEST - 1, versions.HIGHEST]
    assert loop not in threads[1:]


def test_a_rise_every_member_is_ready_for_is_waited_for() -> None:
    async def run() -> None:
        keeper, machine = _keeper({"a": versions.MINE, "b": versions.MINE})
        wait = keeper.until(versions.DURABLE_GROUPS)
        assert wait is not None
        waiting = asyncio.ensure_future(wait)
        keeper.round()
        await asyncio.sleep(0)
        assert not waiting.done()
        machine.cluster_version = versions.DURABLE_GROUPS  # the rise, applied here
        keeper.round()
        assert await waiting is True
        assert keeper.until(versions.DURABLE_GROUPS) is None  # allowed now

    asyncio.run(run())


@pytest.mark.parametrize("other", [OLD, None], ids=["older code", "not linked"])
def test_no_wait_when_a_member_holds_the_version(other: versions.Speaks | None) -> None:
    async def run() -> None:
        keeper, _ = _keeper({"a": versions.MINE, "b": other})
        assert keeper.until(versions.DURABLE_GROUPS) is None

    asyncio.run(run())


def test_a_rise_that_does_not_come_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(version_keeper, "RISE_WAIT", 0.01)

    async def run() -> None:
        keeper, _ = _keeper({"a": versions.MINE})
        wait = keeper.until(versions.DURABLE_GROUPS)
        assert wait is not None
        assert await wait is False
        keeper.round()
        assert keeper._waiters == []  # forgotten

    asyncio.run(run())
