"""An archive's data written out as databases, into directories nothing uses yet.

Sealed generations become their files again; a generation read through a snapshot becomes a
LevelDB built from its pairs (and sealed, when its seal was under way at the cut); the
sessions and retained messages become LevelDBs the importer reads back in batches. Session
metas are rewritten on the way: owned by no node (`site` empty: whoever serves the client
next takes it, ownership.py), disconnected now, so the expiry interval counts from the
restore rather than from a disconnection the archive may be weeks old by.
"""

import mmap
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from broker.backup.archive import (
    BadArchive,
    Member,
    Opens,
    checked_members,
    copy_chunks,
    decode_pairs,
)
from broker.backup.chain import Plan
from broker.backup.manifest import RETAINED, SESSIONS, Generation, Manifest, pairs_of
from broker.direct import DirectFile, aligned_buffer
from broker.ds.bulk import Build
from broker.ds.slab import Compression, Slab
from broker.session.durable import records

_META: Final = b"m"
_CREATORS: Final = 8  # databases created at once (`_Targets`)


@dataclass(slots=True)
class Unpacked:
    counts: dict[str, int] = field(default_factory=dict)


def own_meta(key: bytes, value: bytes, now: float) -> bytes:
    """A session's meta as restored (see the module docstring); other keys as they are."""
    kind, client_id = records.split_key(key)
    if kind != _META or key != records.meta_key(client_id):
        return value
    meta = records.Meta.from_bytes(value)
    return replace(meta, site="", connected=False, created=False, stalled=False,
                   disconnected_at=now).to_bytes()


class _Build:
    """A new LevelDB being built from a `.pairs` member, part after part (manifest.py), as
    tables written past the page cache, unsynced (bulk.Build: the import syncs the tree it
    swaps in, and throws the sessions' and retained messages' away once read)."""

    def __init__(self, path: Path, compression: Compression, sessions: bool) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._build = Build(path, compression, direct=True)
        self._sessions = sessions
        self._now = time.time()
        self.count = 0

    def add(self, pairs: Member, where: str) -> None:
        """Blocking: a part's pairs."""
        put, now = self._build.put, self._now
        for key, value in decode_pairs(pairs, where):
            put(key, own_meta(key, value, now) if self._sessions else value)
            self.count += 1

    def finish(self) -> int:
        """Blocking: the rest written; the pairs' count."""
        try:
            self._build.finish([])
        except BaseException:
            self.abort()
            raise
        return self.count

    def abort(self) -> None:
        self._build.close()


def unpack(archives: Sequence[Opens], plan: Plan, shard_dir: Callable[[int], Path],
           sessions: Path, retained: Path, compression: Compression) -> Unpacked:
    """Blocking: every member written out (see the module docstring), checked as it is
    (archive.checked_members: raises BadArchive, and the caller removes what was written,
    at the first member that is not what the archive lists); sealed-at-the-cut pairs
    generations sealed once all are checked. `archives`: a full one, then its increments
    (chain.py); of each, the generations `plan` takes from it (every member checked)."""
    result = Unpacked({"sessions_keys": 0, "retained": 0, "generations": 0})
    to_seal: list[tuple[Path, Generation]] = []
    with ThreadPoolExecutor(_CREATORS, thread_name_prefix="restore-create") as creators:
        for index, archive in enumerate(archives):
            targets = _Targets(plan.take[index], index == plan.last, shard_dir,
                               (sessions, retained), compression, result, to_seal, creators)
            try:
                _unpack_one(archive, targets)
            finally:
                targets.close()
    for target, gen in to_seal:
        slab = Slab.open(target, gen.generation, compression)
        assert gen.sealed_at is not None
        slab.seal(gen.sealed_at, gen.shard)
        slab.close()
    return result


class _Targets:
    """Where one archive's members go (of `take` its generations; with `last` the sessions
    and retained messages, into `state`). The databases its `.pairs` members become are
    created ahead, side by side, once its manifest is read: with snappy configured, each is
    a LevelDB (bulk.Build), which syncs a new database's directory two or three times, tens
    of milliseconds each on a busy disk, which the unpacking then does not wait for one
    after another (else a directory made)."""

    def __init__(self, take: frozenset[str], last: bool, shard_dir: Callable[[int], Path],
                 state: tuple[Path, Path], compression: Compression, result: Unpacked,
                 to_seal: list[tuple[Path, Generation]], creators: ThreadPoolExecutor,
                 ) -> None:
        self._take, self._last, self._shard_dir, self._state = take, last, shard_dir, state
        self._compression, self._result, self._to_seal = compression, result, to_seal
        self._creators = creators
        self._created: dict[str, Future[_Build]] | None = None
        self._buffer: mmap.mmap | None = None  # the sealed files' (write_file: one at a time)
        self.by_path: dict[str, Generation] = {}

    def manifest(self, manifest: Manifest) -> None:
        self.by_path = _generations(manifest)
        if self._created is not None:
            return  # (checksums.json's: the same generations)
        wanted = [SESSIONS, RETAINED] if self._last else []
        wanted += [g.path + ".pairs" for g in self.by_path.values()
                   if not g.files and g.path in self._take]
        self._created = {pairs: self._creators.submit(self._create, pairs)
                         for pairs in wanted}

    def _create(self, pairs: str) -> _Build:
        if pairs in (SESSIONS, RETAINED):
            is_sessions = pairs == SESSIONS
            return _Build(self._state[0] if is_sessions else self._state[1], None,
                          is_sessions)
        gen = self.by_path[pairs.removesuffix(".pairs")]
        return _Build(_gen_dir(self._shard_dir(gen.shard), gen), self._compression, False)

    def build(self, pairs: str) -> _Build | None:
        """Where a `.pairs` member goes: its database, or None (not restored from here)."""
        if pairs not in (SESSIONS, RETAINED):
            gen = _wanted(pairs, pairs.removesuffix(".pairs"), self.by_path, self._take)
            if gen is None:
                return None
            self._result.counts["generations"] += 1
            if gen.sealed_at is not None:
                self._to_seal.append((_gen_dir(self._shard_dir(gen.shard), gen), gen))
        elif not self._last:
            return None
        created = (self._created or {}).pop(pairs, None)
        return created.result() if created is not None else self._create(pairs)

    def write_file(self, path: str, handle: Member) -> None:
        """A sealed generation's file, as it is."""
        gen = _wanted(path, path.rpartition("/")[0], self.by_path, self._take)
        if gen is None:
            return
        target = _gen_dir(self._shard_dir(gen.shard), gen)
        if not target.exists():
            target.mkdir(parents=True)
            self._result.counts["generations"] += 1
        # Past the page cache (broker/direct.py); synced with the whole tree before it is swapped
        # in (restore.py: files.sync_tree, the syncs side by side).
        if self._buffer is None:
            self._buffer = aligned_buffer()
        with DirectFile(target / path.rpartition("/")[2], sync=False, buffer=self._buffer) as out:
            for chunk in copy_chunks(handle):
                out.write(chunk)

    def counted(self, pairs: str, count: int) -> None:
        """The sessions' or retained messages' database built: its keys."""
        self._result.counts["sessions_keys" if pairs == SESSIONS else "retained"] = count

    def close(self) -> None:
        """Blocking: the databases created ahead and never built (the archive failed its
        checks, or lacks the member) closed."""
        for created in (self._created or {}).values():
            if created.exception() is None:  # (else its creation failed: nothing to close)
                created.result().abort()
        self._created = {}


def _unpack_one(archive: Opens, targets: _Targets) -> None:
    """One archive of `unpack`'s, into `targets`."""
    building: tuple[str, _Build | None] | None = None  # a `.pairs` member: its parts come
    built: set[str] = set()

    def finish() -> None:
        nonlocal building
        name, build = building or ("", None)
        building = None
        if build is not None:
            count = build.finish()
            if name in (SESSIONS, RETAINED):
                targets.counted(name, count)

    with archive.open("rb") as file:
        try:
            for manifest, path, handle in checked_members(file):
                pairs = pairs_of(path)
                if building is not None and building[0] != pairs:
                    finish()
                if handle is None:
                    targets.manifest(manifest)
                elif pairs is None:
                    targets.write_file(path, handle)
                else:
                    if building is None:
                        if pairs in built:
                            raise BadArchive(f"{path}: a part of {pairs} after another member")
                        built.add(pairs)
                        building = pairs, targets.build(pairs)
                    if building[1] is not None:
                        building[1].add(handle, path)
            finish()
        finally:
            if building is not None and building[1] is not None:
                building[1].abort()


def _wanted(path: str, directory: str, by_path: dict[str, Generation],
            take: frozenset[str]) -> Generation | None:
    gen = by_path.get(directory)
    if gen is None:
        raise BadArchive(f"{path}: no generation {directory} in the manifest")
    return gen if directory in take else None  # else a later archive's copy, or one the
    # last cut no longer has


def _generations(manifest: Manifest) -> dict[str, Generation]:
    return {g.path: g for g in manifest.generations if g.in_archive}


def _gen_dir(shard: Path, gen: Generation) -> Path:
    shard.mkdir(parents=True, exist_ok=True)
    return shard / f"gen-{gen.generation:06d}"


def remove(*paths: Path) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
