"""What an export reads, fixed at one cut on the event loop; read afterwards on a thread.

The cut is one turn of the event loop, after a barrier through every Raft group when the
storage is replicated (its replicas here then hold everything committed before the export
began): in that turn every database's LevelDB snapshot is taken and each group's applied
index noted, so every position a session holds names a message the shards' snapshots hold
(the shards apply on this loop, synchronously, in log order). Sealed generations are
immutable and listed at the cut; a sealed one is read later as its LevelDB files, with the
slab opened and pinned while its small mutable files (CURRENT, MANIFEST, log) are read, so
no reader's reopen changes them underneath (its tables never change). A generation whose
seal is still under way (compaction rewriting its tables) is read through a snapshot like
the current one.

Left out: the Raft bookkeeping of a replica (applied index, snapshot marker, writers'
chains and serials), sessions' per-node heartbeats, the retained `$SYS` topics (the node's
own), and `ds/reserve.bin`.
"""

import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from broker.backup.archive import encode_pairs
from broker.backup.manifest import RETAINED, SESSIONS, Generation
from broker.ds import DurableStorage
from broker.ds import keys as ds_keys
from broker.ds.manifest import NAME as SLAB_MANIFEST
from broker.ds.slab import Slab
from broker.retainer.store import RetainedStore

RAFT_META: Final = ds_keys.meta_key("raft_")  # replica bookkeeping in slabs and sessions
_HEARTBEAT: Final = b"h\x00"
_RETAINED_MARKER: Final = b"\x00"
_SYS: Final = b"$SYS/"
_LEVELDB_OWN: Final = frozenset({"LOCK", "LOG", "LOG.old"})  # per process: never copied
_TABLE_SUFFIXES: Final = (".ldb", ".sst")  # immutable once written
SESSIONS_GROUP: Final = 1  # broker/cluster/ds_groups.py's (this package imports no cluster)
# A sealed generation read as its files: (member directory, slab, acquire, release).
Sealed = tuple[str, Slab, Callable[[Slab], None], Callable[[Slab], None]]


class Replicated(Protocol):
    """The Raft groups of replicated Durable Storage, as an export needs them."""

    machines: dict[int, Any]

    async def sync(self, sessions: bool = True) -> bool: ...

    def sites(self) -> list[str]: ...


class ExportFailed(Exception):
    """The export cannot be made now (why, for the operator)."""


@dataclass(slots=True)
class Source:
    """A member to be: its path, its size (None: a database read through a snapshot, of a
    size known once read: it goes out in parts, manifest.PART_BYTES) and how to read it."""

    path: str
    size: int | None
    read: Callable[[], Iterator[bytes]]


@dataclass(slots=True)
class Table:
    """A member to be that is a sealed generation's table: a file that never changes (its
    checksum is kept between exports, export.py)."""

    path: str
    size: int
    file: Path


@dataclass(slots=True)
class Cut:
    cut: dict[str, int | None]
    generations: list[Generation]
    sources: list[Source | Table]
    cluster: dict[str, Any]
    # Sealed generations to expand into file sources on the thread: (member dir, slab, pin).
    sealed: list[Sealed] = field(default_factory=list)
    _release: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def expand_sealed(self) -> None:
        """On the thread: each sealed generation's files as sources (its mutable small files
        read now, pinned open; its tables read from disk when their turn comes)."""
        for directory, slab, acquire, release in self.sealed:
            acquire(slab)
            try:
                self.sources += _slab_files(directory, slab.path)
            finally:
                release(slab)
        self.sealed.clear()

    def release(self) -> None:
        """The snapshots and pins the cut holds (once the archive is written)."""
        with self._lock:
            for release in self._release:
                release()
            self._release.clear()


def _slab_files(directory: str, path: Path) -> list[Source | Table]:
    sources: list[Source | Table] = []
    for file in sorted(path.iterdir()):
        if file.name in _LEVELDB_OWN or not file.is_file():
            continue
        member = f"{directory}/{file.name}"
        if file.name.endswith(_TABLE_SUFFIXES):
            sources.append(Table(member, file.stat().st_size, file))
        else:  # CURRENT, MANIFEST-*, *.log, manifest.json: small, and a reopen replaces them
            data = file.read_bytes()
            sources.append(Source(member, len(data), functools.partial(iter, (data,))))
    return sources


def _pairs_reader(view: Any, keep: Callable[[bytes], bool]) -> Callable[[], Iterator[bytes]]:
    def pairs() -> Iterator[tuple[bytes, bytes]]:
        with view.iterator() as items:
            for key, value in items:
                if keep(key):
                    yield key, value
    return lambda: encode_pairs(pairs())


def _keep_slab_key(key: bytes) -> bool:
    return not key.startswith(RAFT_META)


def keep_session_key(key: bytes) -> bool:
    return not key.startswith((RAFT_META, _HEARTBEAT))


def _keep_retained_key(key: bytes) -> bool:
    return not key.startswith((_RETAINED_MARKER, _SYS))


async def collect(ds: DurableStorage, retainer: RetainedStore | None,
                  groups: Replicated | None, since_us: int | None) -> Cut:
    """On the loop: the barrier (replicated), then the cut, in one turn from there. Every
    shard has a current generation in the archive: those never written are created first."""
    await ds.messages.create_async()
    if groups is not None and not await groups.sync():
        raise ExportFailed("a Raft group did not commit a barrier in time: this node may be"
                           " cut off from a majority; export from another node")
    cut: dict[str, int | None] = {}
    sources: list[Source | Table] = []
    generations: list[Generation] = []
    release: list[Callable[[], None]] = []
    sealed: list[Sealed] = []
    messages = ds.messages
    open_slabs = messages.open_slabs
    try:
        for shard in messages.created_shards:
            cut[f"messages/shard-{shard.index:03d}"] = (
                shard.applied()[0] if groups is not None else None)
            for generation, slab in sorted(shard.slabs.items()):
                on_disk = slab.sealed and (slab.path / SLAB_MANIFEST).exists()
                # Incremental: what was sealed since (an earlier archive may hold it as its
                # then current generation, without what came after), made since, or not
                # sealed on disk.
                wanted = (since_us is None or not on_disk or slab.created >= since_us
                          or (slab.sealed_at is not None and slab.sealed_at >= since_us))
                entry = Generation(shard.index, generation, slab.created, slab.sealed_at,
                                   on_disk, wanted)
                generations.append(entry)
                if not wanted:
                    continue
                if on_disk:
                    sealed.append((entry.path, slab, open_slabs.acquire, open_slabs.release))
                    continue
                open_slabs.acquire(slab)  # current, or its seal under way: open and pinned
                view = slab.db.snapshot()
                release.append(_closer(view, functools.partial(open_slabs.release, slab)))
                sources.append(Source(entry.path + ".pairs", None,
                                      _pairs_reader(view, _keep_slab_key)))
        sessions_view = ds.sessions.view()
        release.append(_closer(sessions_view))
        sources.insert(0, Source(SESSIONS, None,
                                 _pairs_reader(sessions_view, keep_session_key)))
        if groups is not None:
            cut["sessions"] = groups.machines[SESSIONS_GROUP].applied_index
        if retainer is not None:
            retained_view = retainer.view()
            release.append(_closer(retained_view))
            reader = _pairs_reader(retained_view, _keep_retained_key)
            cut["metadata"] = retainer.applied()[0]
        else:
            reader = lambda: iter(())  # noqa: E731
        sources.insert(1, Source(RETAINED, None, reader))
    except BaseException:
        for undo in release:
            undo()
        raise
    settings = ds.settings
    cluster = {
        "site": ds.site_id, "backend": "builtin_raft" if groups is not None else "builtin_local",
        "n_shards": messages.n_shards, "sites": groups.sites() if groups else [ds.site_id],
        "replication_factor": settings.replication_factor if groups else 1,
    }
    return Cut(cut, generations, sources, cluster, sealed, release)


def _closer(view: Any, then: Callable[[], None] | None = None) -> Callable[[], None]:
    def close() -> None:
        view.close()
        if then is not None:
            then()
    return close
