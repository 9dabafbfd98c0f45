"""Bringing an archive back: every checksum checked before anything changes, then the data
installed the way the target takes it.

- A running node (`import_online`, HTTP): refused unless it holds no data (no stored
  message, no session, no retained message but its own `$SYS` ones). Each shard's
  directory is built beside it and swapped in (files.swap_in: as a Raft snapshot is
  installed), the shard reopened; retained messages go through the retainer's writer (the
  metadata Raft group's log), sessions through the `sessions` database's writes (group
  commit, or its Raft group's log when replicated), and a single node then restores them as
  at start-up. Messages first, sessions last: a session appears with its messages there.
- A stopped node (`import_offline`, `--force --data-dir`): its durable state replaced
  whatever it held: `ds/messages`, `ds/sessions`, `retained`, and the Raft write-ahead log
  and group records, so the node starts its groups afresh from the restored state, as at
  its first start (its site ID, cookie, members and API key stay). Every node of a
  builtin_raft cluster is restored alike before any starts.
"""

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import plyvel  # type: ignore[import-untyped]

from broker.backup.archive import BadArchive, verify
from broker.backup.collect import _keep_session_key  # one rule for what is a session's
from broker.backup.manifest import Manifest, unreadable_formats
from broker.backup.unpack import remove, unpack
from broker.ds import DurableStorage
from broker.ds.db import DB_FILE
from broker.ds.files import recover_swap, staging, swap_in, write_atomically
from broker.ds.settings import Settings
from broker.formats import DATA_DIR, in_tree
from broker.retainer.store import RetainedStore, decode_record
from broker.session.message import Message

_SESSION_BATCH: Final = 1000  # keys per sessions write (a Raft command when replicated)
_RETAINED_BATCH: Final = 256  # retained messages in flight at once


class ImportRefused(Exception):
    """Nothing was changed. `code`: NOT_EMPTY, BAD_ARCHIVE or UNSUPPORTED."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def check(archive: Path) -> Manifest:
    """Blocking: the archive verified whole, and one this release can restore."""
    try:
        with archive.open("rb") as file:
            manifest = verify(file)
    except BadArchive as error:
        raise ImportRefused("BAD_ARCHIVE", str(error)) from None
    unreadable = unreadable_formats(manifest, {f.name: f.version for f in in_tree(DATA_DIR)})
    if unreadable:
        raise ImportRefused("BAD_ARCHIVE", "the archive holds formats this release does not"
                            " read: " + ", ".join(unreadable))
    if manifest.since_us is not None:
        raise ImportRefused("UNSUPPORTED", "an incremental archive (--since) holds only the"
                            " sealed generations made after an earlier one: restore the full"
                            " archive it follows")
    return manifest


def emptiness(ds: DurableStorage, retainer: RetainedStore | None) -> str | None:
    """Why the node holds data (None: it holds none)."""
    for shard in ds.messages.shards:
        stored = sum(slab.stats.messages for slab in shard.slabs.values())
        if stored:
            return f"messages shard {shard.index} holds {stored} messages"
    for key, _ in ds.sessions.scan(b""):
        if _keep_session_key(key):
            return f"the sessions database holds data (key {key[:64]!r})"
    if retainer is not None and retainer.match("#"):
        return f"{len(retainer.match('#'))} retained messages are stored"
    return None


@dataclass(slots=True)
class Target:
    """A running node as an import writes to it."""

    ds: DurableStorage
    retainer: RetainedStore | None
    write_retained: Callable[[Message], Awaitable[None]] | None
    sessions_restored: Callable[[], object]  # a single node loads its sessions again
    replicated: bool


async def _blocking(call: Callable[..., Any], *args: Any) -> Any:
    with ThreadPoolExecutor(1, thread_name_prefix="restore") as pool:
        return await asyncio.get_running_loop().run_in_executor(pool, call, *args)


async def import_online(archive: Path, target: Target) -> dict[str, int]:
    """Checks, then restores into a running empty node (see the module docstring); raises
    ImportRefused with nothing changed."""
    manifest: Manifest = await _blocking(check, archive)
    ds = target.ds
    if target.replicated:
        raise ImportRefused("UNSUPPORTED", "import into a running builtin_raft cluster is"
                            " not supported yet: restore every stopped node with `broker ctl"
                            " data import FILE --force --data-dir DIR` before its first start")
    if manifest.n_shards != ds.messages.n_shards:
        raise ImportRefused("BAD_ARCHIVE", f"the archive has {manifest.n_shards} shards, this"
                            f" node {ds.messages.n_shards} (durable_storage.messages.n_shards"
                            f" is fixed when the data dir is made): restore into a node"
                            f" started with n_shards = {manifest.n_shards}")
    reason = emptiness(ds, target.retainer)
    if reason is not None:
        raise ImportRefused("NOT_EMPTY", f"the node holds data ({reason}): import only into"
                            f" an empty node, or --force --data-dir into a stopped one")
    work = ds.root / "import.staging"
    messages = ds.messages
    shard_dirs = [staging(shard.path) for shard in messages.shards]
    remove(work, *shard_dirs)
    try:
        unpacked = await _blocking(
            unpack, archive, shard_dirs.__getitem__, work / "sessions", work / "retained",
            ds.settings.leveldb_compression)
        for shard in list(messages.shards):
            messages.close_shard_now(shard.index)
            swap_in(shard.path)
            messages.reopen_shard(shard.index)
        counts = unpacked.counts
        counts["retained"] = await _restore_retained(work / "retained", target)
        counts["sessions"] = await _restore_sessions(work / "sessions", ds)
    finally:
        await _blocking(remove, work, *shard_dirs)
    target.sessions_restored()
    return counts


async def _restore_retained(path: Path, target: Target) -> int:
    db = plyvel.DB(str(path))
    restored = 0
    try:
        waiting: list[Awaitable[None]] = []
        for _, record in db.iterator():
            message = decode_record(record)
            if message.is_expired():  # (an old archive holds messages expired since)
                continue
            if target.write_retained is not None:
                waiting.append(target.write_retained(message))
            elif target.retainer is not None:
                target.retainer.put(message)
            restored += 1
            if len(waiting) >= _RETAINED_BATCH:
                await asyncio.gather(*waiting)
                waiting = []
        await asyncio.gather(*waiting)
    finally:
        db.close()
    return restored


async def _restore_sessions(path: Path, ds: DurableStorage) -> int:
    db = plyvel.DB(str(path))
    written = 0
    try:
        batch: dict[bytes, bytes | None] = {}
        for key, value in db.iterator():
            batch[key] = value
            if len(batch) >= _SESSION_BATCH:
                await ds.sessions.write_soon(batch, sync=True)
                written += len(batch)
                batch = {}
        if batch:
            await ds.sessions.write_soon(batch, sync=True)
            written += len(batch)
    finally:
        db.close()
    return written


# ---- offline -------------------------------------------------------------------------------
def _running(data_dir: Path) -> bool:
    """Whether a node holds the data dir (LevelDB's lock on its sessions database)."""
    sessions = data_dir / "ds" / "sessions"
    if not sessions.is_dir():
        return False
    try:
        plyvel.DB(str(sessions)).close()
    except plyvel.IOError:
        return True
    return False


def import_offline(archive: Path, data_dir: Path, wal_dir: Path) -> dict[str, int]:
    """Blocking: replaces a stopped node's durable state (see the module docstring)."""
    if _running(data_dir):
        raise ImportRefused("NOT_EMPTY", f"{data_dir}: a node is running on it (its sessions"
                            f" database is locked): stop it first")
    manifest = check(archive)
    ds_root = data_dir / "ds"
    roots = {"messages": ds_root / "messages", "sessions": ds_root / "sessions",
             "retained": data_dir / "retained"}
    for root in roots.values():
        recover_swap(root)
        remove(staging(root))
        root.mkdir(parents=True, exist_ok=True)
    fresh = {name: staging(root) for name, root in roots.items()}
    try:
        unpacked = unpack(archive, lambda i: fresh["messages"] / f"shard-{i:03d}",
                          fresh["sessions"], fresh["retained"], Settings().leveldb_compression)
        write_atomically(fresh["messages"] / DB_FILE,
                         json.dumps({"n_shards": manifest.n_shards, "format": 1}).encode())
        for root in roots.values():
            swap_in(root)
    finally:
        remove(*fresh.values())
    # The Raft groups start afresh from the restored state: their logs and records go.
    for raft_state in (wal_dir, data_dir / "raft"):
        shutil.rmtree(raft_state, ignore_errors=True)
    return unpacked.counts
