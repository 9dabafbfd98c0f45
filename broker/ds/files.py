"""Crash-safe files and directories: after a crash one written or swapped in here is whole
(old or new)."""

import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

_SYNCING_THREADS: Final = 8
"""fsyncs in flight at once (sync_tree): the device merges what it is given together."""


def fsync_dir(path: Path) -> None:
    """Makes a rename or a new entry in `path` survive power loss."""
    _fsync_path(path)


def sync_tree(*roots: Path) -> None:
    """Blocking: every file and directory under `roots` synced, side by side. A tree written
    without a sync per file (an import's sealed tables) must be on the device before it is
    swapped in: the rename is synced, and after a power loss a renamed directory whose
    files' data or entries were still in the page cache would hold tables cut short, with
    the data it replaced already gone."""
    paths = [path for root in roots if root.exists() for path in (root, *root.rglob("*"))]
    with ThreadPoolExecutor(_SYNCING_THREADS, thread_name_prefix="sync") as pool:
        for _ in pool.map(_fsync_path, paths):
            pass


def _fsync_path(path: Path) -> None:
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def write_atomically(path: Path, data: bytes, mode: int = 0o666) -> None:
    """Blocking: `path` holds `data`, old or new after a crash, never part of it: a
    temporary file, fsync'd, renamed over it, and the rename fsync'd. The temporary file is
    made with `mode` (less the umask), so that a secret's (0o600) is never readable by
    others, not even until a chmod; for a secret, one an earlier crash left goes first,
    as its mode, and whoever holds it open, would stay."""
    tmp = path.with_name(path.name + ".tmp")
    if mode != 0o666:
        tmp.unlink(missing_ok=True)
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_all_atomically(files: dict[Path, bytes]) -> None:
    """Blocking: `write_atomically` of every file, side by side: each write waits on two
    fsyncs (1-8 ms each on a busy disk), and a start on an empty data dir writes several
    small files before its first client, which need not wait for one another's. Each file
    is whole or absent after a crash; which of them were written is not ordered."""
    with ThreadPoolExecutor(max(1, len(files)), thread_name_prefix="write") as pool:
        for _ in pool.map(write_atomically, files, files.values()):
            pass


def staging(path: Path) -> Path:
    """Where a database that will replace `path` is built (a snapshot being installed)."""
    return path.with_name(path.name + ".snapshot")


def rebuild(path: Path, build: Callable[[Path], None], close: Callable[[], None]) -> None:
    """Blocking: `build_staged`, then once `close()` closed what is in use, the new content
    swapped in."""
    build_staged(path, build)
    close()
    swap_in(path)


def build_staged(path: Path, build: Callable[[Path], None]) -> None:
    """Blocking: `build(staging(path))` makes the new content beside `path`, from nothing.
    If building fails (a garbled snapshot), what is in use stays as it was and the staged
    part goes."""
    fresh = staging(path)
    shutil.rmtree(fresh, ignore_errors=True)
    try:
        build(fresh)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise


def swap_in(path: Path) -> None:
    """Blocking: the complete database built at `staging(path)` replaces `path` (or takes
    its place: a shard not created yet). Two renames: a crash between them leaves no
    `path`, and `recover_swap` finishes the swap."""
    fresh, retired = staging(path), _retired(path)
    shutil.rmtree(retired, ignore_errors=True)
    replaced = path.exists()
    if replaced:
        path.rename(retired)
    fresh.rename(path)
    fsync_dir(path.parent)
    if replaced:
        shutil.rmtree(retired)


def recover_swap(path: Path) -> None:
    """Blocking, before `path` is opened: finishes a `swap_in` a crash cut short, or drops
    a staged database that never got that far (it may be incomplete; the replica then has
    its old state and asks for the snapshot again)."""
    fresh, retired = staging(path), _retired(path)
    if fresh.exists():
        if path.exists():
            shutil.rmtree(fresh)
        else:
            fresh.rename(path)
            fsync_dir(path.parent)
    shutil.rmtree(retired, ignore_errors=True)


def _retired(path: Path) -> Path:
    return path.with_name(path.name + ".retired")
