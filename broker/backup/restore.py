"""Bringing an archive back: every checksum checked before anything changes, then the data
installed the way the target takes it.

- A running node (`import_online`, HTTP): refused unless it holds no data (no stored
  message, no session, no retained message but its own `$SYS` ones). Each shard's
  directory is built beside it and swapped in (files.swap_in: as a Raft snapshot is
  installed), the shard reopened; in a builtin_raft cluster (every node holds a full
  replica: its own is checked after a barrier) each generation goes instead through its
  shard's Raft log as LOAD commands of its keys (replication_layer.py), so every replica,
  one that joins later included (from the log or a snapshot), holds the same slabs;
  retained messages go through the retainer's writer (the metadata Raft group's log),
  sessions through the `sessions` database's writes (group commit, or its Raft group's log
  when replicated), and a single node then restores them as at start-up. Messages first,
  sessions last: a session appears with its messages there.
- A stopped node (`import_offline`, `--force --data-dir`): its durable state replaced
  whatever it held: `ds/messages`, `ds/sessions`, `retained`, and the Raft write-ahead log
  and group records, so the node starts its groups afresh from the restored state, as at
  its first start (its site ID, cookie, members and API key stay). Every node of a
  builtin_raft cluster is restored alike before any starts.

Either takes a full archive alone, or a full archive and the incremental ones made after it,
oldest first (chain.py: each increment must follow the archive before it; the last gives
the sessions, retained messages and current generations).
"""

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import plyvel  # type: ignore[import-untyped]

from broker.backup.archive import BadArchive, Opens, read_manifest
from broker.backup.chain import BadChain, Plan, plan
from broker.backup.collect import RAFT_META, keep_session_key
from broker.backup.manifest import Manifest, unreadable_formats
from broker.backup.unpack import Unpacked, remove, unpack
from broker.ds import DurableStorage
from broker.ds import replication_layer as cmd
from broker.ds.db import DB_FILE
from broker.ds.files import recover_swap, staging, swap_in, sync_tree, write_atomically
from broker.ds.settings import Settings
from broker.ds.slab import Compression
from broker.formats import DATA_DIR, in_tree
from broker.retainer.store import RetainedStore, decode_record
from broker.session.message import Message

log = logging.getLogger(__name__)

_SESSION_BATCH: Final = 1000  # keys per sessions write (a Raft command when replicated)
_RETAINED_BATCH: Final = 256  # retained messages in flight at once
_LOAD_BYTES: Final = 512 << 10  # keys and values per LOAD command


class ImportRefused(Exception):
    """Nothing was changed. `code`: NOT_EMPTY, BAD_ARCHIVE, UNAVAILABLE or CLUSTER_VERSION
    (the cluster's effective version does not allow LOAD commands yet)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def check(archives: Sequence[Opens], names: Sequence[str] | None = None,
          ) -> tuple[Manifest, Plan]:
    """Blocking: the last archive's manifest and where each generation comes from, of
    archives this release can restore: a full one, then its increments, oldest first
    (chain.py). `names`: the archives as the operator knows them (default: their paths).
    Their members are checked as they are unpacked (`_unpack`), before anything is
    installed."""
    names = [str(path) for path in archives] if names is None else list(names)
    readable = {f.name: f.version for f in in_tree(DATA_DIR)}
    manifests = []
    for archive, name in zip(archives, names, strict=True):
        try:
            with archive.open("rb") as file:
                manifest = read_manifest(file)
        except BadArchive as error:
            raise ImportRefused("BAD_ARCHIVE", f"{name}: {error}") from None
        unreadable = unreadable_formats(manifest, readable)
        if unreadable:
            raise ImportRefused("BAD_ARCHIVE", f"{name} holds formats this release does not"
                                f" read: " + ", ".join(unreadable))
        manifests.append(manifest)
    try:
        return manifests[-1], plan(names, manifests)
    except BadChain as error:
        raise ImportRefused("BAD_ARCHIVE", str(error)) from None


def emptiness(ds: DurableStorage, retainer: RetainedStore | None) -> str | None:
    """Why the node holds data (None: it holds none)."""
    for shard in ds.messages.created_shards:
        stored = sum(slab.stats.messages for slab in shard.slabs.values())
        if stored:
            return f"messages shard {shard.index} holds {stored} messages"
    for key, _ in ds.sessions.raw_items():  # read until the first: a full one is not listed
        if keep_session_key(key):
            return f"the sessions database holds data (key {key[:64]!r})"
    retained = retainer.match("#") if retainer is not None else []
    if retained:
        return f"{len(retained)} retained messages are stored"
    return None


class Loads(Protocol):
    """Replicated Durable Storage's groups as an import writes through them."""

    async def sync(self, sessions: bool = True) -> bool: ...

    async def load(self, shard: int, command: bytes) -> None: ...


@dataclass(slots=True)
class Target:
    """A running node as an import writes to it."""

    ds: DurableStorage
    retainer: RetainedStore | None
    write_retained: Callable[[Message], Awaitable[None]] | None
    sessions_restored: Callable[[], object]  # a single node loads its sessions again
    groups: Loads | None  # replicated
    # Why the cluster cannot take LOAD commands now (its effective version: versions.py,
    # which this package does not import), None when it can.
    load_refusal: Callable[[], str | None] = lambda: None


async def _blocking(call: Callable[..., Any], *args: Any) -> Any:
    """`call` on a thread of its own. Cancelled, the loop does not wait for the thread: an
    unpack reading an upload (pipe.py) waits for the loop to end the upload."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="restore")
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, call, *args)
    finally:
        pool.shutdown(wait=False)


async def import_online(archives: Sequence[Opens], target: Target,
                        names: Sequence[str] | None = None) -> dict[str, int]:
    """Checks, then restores into a running empty node (see the module docstring): one full
    archive, or one and its increments, oldest first (`check`); raises ImportRefused with
    nothing changed."""
    started = time.monotonic()
    groups = target.groups
    refusal = target.load_refusal() if groups is not None else None
    if refusal is not None:
        raise ImportRefused("CLUSTER_VERSION", refusal)
    manifest, planned = await _blocking(check, archives, names)
    ds = target.ds
    if groups is not None and not await groups.sync():
        raise ImportRefused("UNAVAILABLE", "a Raft group did not commit a barrier in time:"
                            " this node may be cut off from a majority")
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
    # Built apart from the shards' own staging dirs: a write that creates a shard meanwhile
    # would take one there as a swap a crash cut short (files.recover_swap).
    shard_dirs = [work / f"shard-{i:03d}" for i in range(messages.n_shards)]
    await _blocking(remove, work)
    try:
        unpacked = await _blocking(
            _unpack, archives, planned, shard_dirs.__getitem__, work / "sessions",
            work / "retained", ds.settings.leveldb_compression)
        log.info("import: checked and unpacked in %.1f s", time.monotonic() - started)
        if groups is None:
            await _blocking(sync_tree, *shard_dirs)
            await messages.settled(range(messages.n_shards))
            # Checked again with nothing awaited before the shards are closed: a message a
            # client published meanwhile, acknowledged, must not be swapped away.
            reason = emptiness(ds, target.retainer)
            if reason is not None:
                raise ImportRefused("NOT_EMPTY", f"the node took data during the import"
                                    f" ({reason}): nothing was imported")
            await messages.replace_shards(dict(enumerate(shard_dirs)))
        else:
            await asyncio.gather(*(_load_shard(groups, i, shard_dirs[i], manifest)
                                   for i in range(messages.n_shards)))
        counts = unpacked.counts
        counts["retained"] = await _restore_retained(work / "retained", target)
        counts["sessions"] = await _restore_sessions(work / "sessions", ds)
    finally:
        await _blocking(remove, work)
    if groups is None:
        target.sessions_restored()
    log.info("import: %s restored in %.1f s: %s", ", ".join(map(str, names or archives)),
             time.monotonic() - started, counts)
    return counts


def _chunks(path: Path, skip: bytes) -> Iterator[list[tuple[bytes, bytes]]]:
    """Blocking: a generation's keys (but replica bookkeeping), LOAD_BYTES at a time."""
    db = plyvel.DB(str(path))
    try:
        chunk: list[tuple[bytes, bytes]] = []
        size = 0
        for key, value in db.iterator():
            if key.startswith(skip):
                continue
            chunk.append((key, value))
            size += len(key) + len(value)
            if size >= _LOAD_BYTES:
                yield chunk
                chunk, size = [], 0
        yield chunk
    finally:
        db.close()


async def _load_shard(groups: Loads, shard: int, directory: Path, manifest: Manifest) -> None:
    """Each generation of the shard, oldest first, as LOAD commands through its log (read
    on a thread, a chunk ahead of the commit)."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1, thread_name_prefix="restore") as pool:
        for gen in sorted((g for g in manifest.generations if g.shard == shard),
                          key=lambda g: g.generation):
            chunks = _chunks(directory / f"gen-{gen.generation:06d}", RAFT_META)
            chunk = await loop.run_in_executor(pool, next, chunks)
            flags = cmd.LOAD_FIRST
            while True:
                following = await loop.run_in_executor(pool, next, chunks, None)
                if following is None:
                    flags |= cmd.LOAD_LAST
                await groups.load(shard, cmd.encode_load(gen.generation, gen.sealed_at or 0,
                                                         flags, chunk))
                if following is None:
                    break
                chunk, flags = following, 0


def _unpack(archives: Sequence[Opens], planned: Plan, shard_dir: Callable[[int], Path],
            sessions: Path, retained: Path, compression: Compression) -> Unpacked:
    try:
        return unpack(archives, planned, shard_dir, sessions, retained, compression)
    except BadArchive as error:
        raise ImportRefused("BAD_ARCHIVE", str(error)) from None


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


def import_offline(archives: Sequence[Path], data_dir: Path, wal_dir: Path) -> dict[str, int]:
    """Blocking: replaces a stopped node's durable state (see the module docstring) with
    one full archive, or one and its increments, oldest first (`check`)."""
    if _running(data_dir):
        raise ImportRefused("NOT_EMPTY", f"{data_dir}: a node is running on it (its sessions"
                            f" database is locked): stop it first")
    manifest, planned = check(archives)
    ds_root = data_dir / "ds"
    roots = {"messages": ds_root / "messages", "sessions": ds_root / "sessions",
             "retained": data_dir / "retained"}
    for root in roots.values():
        recover_swap(root)
        remove(staging(root))
        root.mkdir(parents=True, exist_ok=True)
    fresh = {name: staging(root) for name, root in roots.items()}
    try:
        unpacked = _unpack(archives, planned,
                           lambda i: fresh["messages"] / f"shard-{i:03d}", fresh["sessions"],
                           fresh["retained"], Settings().leveldb_compression)
        write_atomically(fresh["messages"] / DB_FILE,
                         json.dumps({"n_shards": manifest.n_shards, "format": 1}).encode())
        sync_tree(*fresh.values())
        for root in roots.values():
            swap_in(root)
    finally:
        remove(*fresh.values())
    # The Raft groups start afresh from the restored state: their logs and records go.
    for raft_state in (wal_dir, data_dir / "raft"):
        shutil.rmtree(raft_state, ignore_errors=True)
    return unpacked.counts
