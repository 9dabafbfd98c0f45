"""A snapshot install builds a whole new database beside the old one and swaps it in
(files.swap_in): after a crash at any point the next start finds the old database or the
new one, never a mix and never none (files.recover_swap), for the sessions database, a
messages shard and the retained messages alike."""

import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import plyvel  # type: ignore[import-untyped]
import pytest

from broker.ds import DurableStorage
from broker.ds.files import staging, swap_in
from broker.retainer.store import RetainedStore
from broker.session.message import Message
from tests.ds.replicas import Replica, by_generation, stores


def crash_while_staging(path: Path) -> None:
    """The new database half written: staged, not swapped in."""


def crash_between_the_renames(path: Path) -> None:
    path.rename(path.with_name(path.name + ".retired"))


def crash_before_the_old_one_was_removed(path: Path) -> None:
    retired = path.with_name(path.name + ".retired")
    path.rename(retired)
    staging(path).rename(path)


# what the next start finds after each crash
CRASHES: dict[Callable[[Path], None], str] = {
    crash_while_staging: "old", crash_between_the_renames: "new",
    crash_before_the_old_one_was_removed: "new"}


def leftovers(root: Path) -> list[Path]:
    return [*root.rglob("*.snapshot"), *root.rglob("*.retired")]


@pytest.mark.parametrize("crash", CRASHES, ids=lambda crash: crash.__name__)
async def test_the_sessions_database_after_a_crash_in_a_swap(
        open_storage: Callable[..., DurableStorage], tmp_path: Path,
        crash: Callable[[Path], None]) -> None:
    storage = open_storage(tmp_path)
    storage.sessions.apply([(b"k", b"old")], [])
    path = storage.sessions.path
    await storage.close()
    new = plyvel.DB(str(staging(path)), create_if_missing=True)
    new.put(b"k", b"new", sync=True)
    new.close()
    crash(path)
    reopened = open_storage(tmp_path)
    assert reopened.sessions.raw_get(b"k") == CRASHES[crash].encode()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("crash", CRASHES, ids=lambda crash: crash.__name__)
def test_the_retained_messages_after_a_crash_in_a_swap(
        tmp_path: Path, crash: Callable[[Path], None]) -> None:
    def opened() -> RetainedStore:
        return RetainedStore(tmp_path / "retained", 0, 1 << 20, 0)

    store = opened()
    store.put(Message("t", b"old", retain=True))
    store.close()
    new = RetainedStore(staging(tmp_path / "retained"), 0, 1 << 20, 0)
    new.put(Message("t", b"new", retain=True))
    new.close()
    crash(tmp_path / "retained")
    store = opened()
    assert [m.payload for m in store.match("t")] == [CRASHES[crash].encode()]
    store.close()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("crash", CRASHES, ids=lambda crash: crash.__name__)
def test_a_messages_shard_after_a_crash_in_a_swap(
        tmp_path: Path, executor: ThreadPoolExecutor, crash: Callable[[Path], None]) -> None:
    new = Replica(tmp_path / "new", executor)
    for index, data in enumerate(stores(1, 5), start=1):
        new.apply(index, data)
    old = Replica(tmp_path / "old", executor)
    old.apply(1, stores(1, 1, writer="site-b")[0])
    contents = {"old": by_generation(old), "new": by_generation(new)}
    path = old.machine.shard.path
    new.crash()
    old.crash()
    shutil.copytree(new.machine.shard.path, staging(path))  # a whole shard, as installs build
    crash(path)
    reopened = Replica(tmp_path / "old", executor)
    assert by_generation(reopened) == contents[CRASHES[crash]]
    assert leftovers(tmp_path) == []


def test_a_swap_replaces_the_directory_whole(tmp_path: Path) -> None:
    path = tmp_path / "db"
    (path / "a").mkdir(parents=True)
    (staging(path) / "b").mkdir(parents=True)
    swap_in(path)
    assert [p.name for p in path.iterdir()] == ["b"]
    assert leftovers(tmp_path) == []
