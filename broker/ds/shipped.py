"""Sealed generations shipped as the files they are, in a shard's snapshot (version 2).

A sealed slab is a LevelDB directory nothing writes to any more: a replica that lacks it can
take its files as they are, which costs a copy, where rebuilding it from key/value records
(version 1) or from the log costs a LevelDB write of every message, compactions included.
Only the current generation goes as records (or through the log).

On the sender, the files are hard-linked on the dump's thread (`link_sealed`), so neither
retention nor LevelDB (which writes a new MANIFEST at each open) removes what is sent; its
MANIFEST and CURRENT are copied as they are at that moment (a MANIFEST only grows by whole
records, and LevelDB reads a prefix as the version it then held). The stream:

    record  := kind:u8  length:u32  body
    FORMAT  (kind 3) := version:u8 (2)  files:u32        first, in version 2 only
    FILE    (kind 4) := generation:u64 size:u64 stamp:u64 name (UTF-8), `files` of them
    then every listed file's `size` bytes and their CRC-32 (u32), in the list's order,
    spliced in by the spool (broker/raft/spool.py), outside any record
    SLAB, PAIR (kinds 1, 2): as in version 1 (replication_shard.py)

`stamp` names the sender's file (device, inode, modification time, size): the same stamp is
the same bytes. The receiver (`Receiver`) writes each file to `<shard>.snapshot-files/
gen-N/<stamp>-<name>.part` (on a thread of its own: `_Writer`), checks its CRC, writes it
beside it (`.crc`) and has the file synced on a worker thread while the next ones come; the
install waits for those syncs and moves the files in. What is
there survives a broken link, a leader change and a restart of either node (kill -9
included): a later transfer that lists a file again skips it if it is whole and matches its
`.crc` (a power loss may have left anything in files never synced), or has the rest of its
`.part` sent. The list comes first, so the receiver knows where each file's bytes start and
asks for the next one it lacks (the core resumes there), and a resumed transfer sends
nothing twice. A file whose
CRC does not match is removed and fetched again (the core resumes at its first byte); it
is never installed. The records are handed, as they come, to what builds the slabs they
hold (`Records`: shard_snapshot.SlabBuilder), on the writer's thread: the current
generation is written while its records arrive, not after the last one.
"""

import collections
import hashlib
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Final, Generic, NamedTuple, Protocol, TypeVar

import plyvel  # type: ignore[import-untyped]

from broker.ds.files import fsync_dir  # (a file's data as well as a directory's entries)
from broker.ds.replication_layer import BadCommand
from broker.raft.spool import CRC, Insert

FORMAT_RECORD: Final = 3
FILE_RECORD: Final = 4
VERSION: Final = 2

_RECORD: Final = struct.Struct(">BI")
_FILE: Final = struct.Struct(">QQQ")
_FORMAT: Final = struct.Struct(">BI")
_PART: Final = ".part"
# LevelDB's own files that are not data: its lock, its info log.
_NOT_SHIPPED: Final = frozenset({"LOCK", "LOG", "LOG.old"})
_RECORDS: Final = "records"  # in the staging folder, beside the files' `gen-N` folders
_LINK_ATTEMPTS: Final = 5
# Bytes handed to the writer thread and not yet written, past which the loop waits for it
# (a disk slower than the link, or a file creation held by the journal): two chunks.
_WRITE_AHEAD: Final = 2 << 20


class Records(Protocol):
    """What takes a version 2 stream's records, in pieces cut anywhere, on the receiver's
    writer thread (blocking)."""

    def feed(self, data: bytes) -> None: ...

    def close(self) -> None:
        """Given up (the transfer starts over, or the receiver closes): what it wrote goes."""


R = TypeVar("R", bound=Records)


class Shipped(NamedTuple):
    """A received file: its generation, where it is staged, its name in the slab."""

    generation: int
    staged: Path
    name: str


def staging_of(shard_dir: Path) -> Path:
    return shard_dir.with_name(shard_dir.name + ".snapshot-files")


def format_record(files: int) -> bytes:
    return _RECORD.pack(FORMAT_RECORD, _FORMAT.size) + _FORMAT.pack(VERSION, files)


def _stamp(path: Path) -> int:
    st = path.stat()
    key = f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}:{st.st_size}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def link_sealed(slab_dir: Path, into: Path) -> list[tuple[str, Path]]:
    """Blocking, with the slab neither opening nor closing (Slab.steady): its files linked
    (CURRENT and MANIFEST copied) into `into`; (name, path) of each. A file removed under
    it (a compaction of an open slab) makes it start again."""
    for _ in range(_LINK_ATTEMPTS):
        shutil.rmtree(into, ignore_errors=True)
        into.mkdir(parents=True)
        current = (slab_dir / "CURRENT").read_bytes()
        manifest = current.decode().strip()
        with (slab_dir / manifest).open("rb") as file:
            prefix = file.read()  # what it holds now: whole records, or a torn last one
        (into / "CURRENT").write_bytes(current)
        (into / manifest).write_bytes(prefix)
        files = [("CURRENT", into / "CURRENT"), (manifest, into / manifest)]
        try:
            for entry in sorted(os.scandir(slab_dir), key=lambda e: e.name):
                name = entry.name
                if (name in _NOT_SHIPPED or name.startswith("MANIFEST-") or name == "CURRENT"
                        or name.endswith((".tmp", ".dbtmp")) or not entry.is_file()):
                    continue
                os.link(entry.path, into / name)
                files.append((name, into / name))
        except FileNotFoundError:
            continue
        return files
    raise OSError(f"{slab_dir}: its files kept changing while being linked")


def write_files(file: IO[bytes], files: list[tuple[int, str, Path]]) -> list[Insert]:
    """The FILE records of the linked slabs' files (generation, name, link), all of them,
    then where the spool splices their bytes in, one after the other."""
    sizes = []
    for generation, name, path in files:
        size = path.stat().st_size
        raw = name.encode()
        file.write(_RECORD.pack(FILE_RECORD, _FILE.size + len(raw)))
        file.write(_FILE.pack(generation, size, _stamp(path)) + raw)
        sizes.append(size)
    at = file.tell()
    return [Insert(at, path, size) for (_, _, path), size in zip(files, sizes, strict=True)]


_HEAD, _REST, _BODY, _DATA, _CRC = range(5)


class _Listed(NamedTuple):
    generation: int
    size: int
    staged: Path  # where it is written (`.part`), until the install moves it
    name: str
    data: int  # where its bytes start in the stream


class _Writer:
    """The received files' I/O, in order, on a thread of its own: creating a file, writing
    it, closing it once whole, then its sync handed to `syncs` (another thread, so the next
    file is written meanwhile). On the event loop a file's creation waits for the
    filesystem's journal while a sync commits it (ext4: tens of milliseconds per file, most
    of a catch-up's time), and the loop would hold every group it leads meanwhile. A
    failure comes back with a later call (`check`, `drain`)."""

    def __init__(self, syncs: Executor) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="snapshot-files")
        self._syncs = syncs
        self._synced: list[Future[None]] = []
        self._jobs: collections.deque[tuple[Future[None], int]] = collections.deque()
        self._queued = 0  # bytes handed over and not yet written
        self._file: IO[bytes] | None = None

    def open(self, part: Path) -> None:
        self._submit(self._open, part)

    def write(self, data: memoryview) -> None:
        self._submit(self._write, data, size=len(data))
        while self._queued > _WRITE_AHEAD:
            self._settle(self._jobs[0])

    def finish(self, part: Path, checked: Path, crc: int) -> None:
        """The file is whole and its CRC matched: written into `checked`, and the file
        synced."""
        self._submit(self._finish, part, checked, crc)

    def discard(self, part: Path) -> None:
        self._submit(self._discard, part)

    def records(self, records: Records, data: bytes) -> None:
        self._submit(records.feed, data, size=len(data))
        while self._queued > _WRITE_AHEAD:
            self._settle(self._jobs[0])

    def check(self) -> None:
        """Raises what failed among the jobs done."""
        while self._jobs and self._jobs[0][0].done():
            self._settle(self._jobs[0])

    def drain(self) -> None:
        """Blocking: every job handed over done, and the files finished synced; raises what
        failed."""
        while self._jobs:
            self._settle(self._jobs[0])
        for sync in self._synced:
            sync.result()

    def close(self) -> None:
        """Blocking: the jobs handed over end, the open file is closed (a failure is
        forgotten: what comes after starts over)."""
        self._submit(self._close)
        self._thread.shutdown(wait=True)
        self._jobs.clear()

    def _submit(self, job: Callable[..., None], *args: object, size: int = 0) -> None:
        self._jobs.append((self._thread.submit(job, *args), size))
        self._queued += size

    def _settle(self, job: tuple[Future[None], int]) -> None:
        future, size = job
        try:
            future.result()
        finally:
            self._jobs.popleft()
            self._queued -= size

    # On the writer's thread:
    def _open(self, part: Path) -> None:
        self._file = part.open("ab")

    def _write(self, data: memoryview) -> None:
        if self._file is None:
            raise OSError("a shipped file's bytes with no file open for them")
        self._file.write(data)

    def _finish(self, part: Path, checked: Path, crc: int) -> None:
        self._close()
        checked.write_bytes(CRC.pack(crc))
        self._synced.append(self._syncs.submit(fsync_dir, part))

    def _discard(self, part: Path) -> None:
        self._close()
        part.unlink(missing_ok=True)

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Receiver(Generic[R]):
    """Takes a version 2 stream chunk by chunk: files into `staging` (written on a thread of
    their own, `_Writer`), the records, on that thread too, into `records(a folder in
    staging)`, made anew for each transfer. `feed` answers None (go on after the chunk) or
    the offset to go on from."""

    def __init__(self, staging: Path, records: Callable[[Path], R], executor: Executor
                 ) -> None:
        self.staging = staging
        self._make_records = records
        self._executor = executor  # where each file received whole is synced
        self.refetched = 0  # files whose CRC did not match
        self.skipped = 0  # files (and parts) a previous transfer left, not sent again
        self.records: R | None = None
        self._writer: _Writer | None = None
        self._reset()

    @property
    def files(self) -> list[Shipped]:
        return [Shipped(f.generation, f.staged, f.name) for f in self._listed]

    def _reset(self) -> None:
        self.close()
        self._listed: list[_Listed] = []
        self._expected = -1  # files the FORMAT record announced (-1: none yet)
        self._at = 0
        self._mode = _HEAD
        self._buffer = bytearray()
        self._remaining = 0
        self._kind = 0
        self._crc = 0
        self._next = 0  # the file whose bytes come next
        self._kept: set[Path] = set()  # the files in the staging folders when the list came
        self._synced: set[Path] = set()  # the files this transfer wrote whole
        self.staging.mkdir(parents=True, exist_ok=True)
        self.records = self._make_records(self.staging / _RECORDS)
        self._writer = _Writer(self._executor)

    def close(self) -> None:
        """Blocking: the writer's jobs end; the records' builder is given up unless it was
        taken (`take_records`)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.records is not None:
            self.records.close()
            self.records = None

    def take_records(self) -> R:
        """Blocking, once the stream is whole: what took its records, every piece fed (the
        install finishes it)."""
        assert self._writer is not None and self.records is not None
        self._writer.drain()
        records, self.records = self.records, None
        return records

    def feed(self, offset: int, data: bytes) -> int | None:
        if offset == 0:
            self._reset()
        if offset != self._at or self.records is None or self._writer is None:
            raise BadCommand(f"snapshot chunk at {offset}, expected {self._at}")
        self._writer.check()
        view = memoryview(data)
        i = 0
        while i < len(view):
            if self._mode == _HEAD or self._mode == _BODY or self._mode == _CRC:
                target = (_RECORD.size if self._mode == _HEAD else
                          CRC.size if self._mode == _CRC else self._remaining)
                piece = view[i:i + target - len(self._buffer)]
                self._buffer += piece
                i += len(piece)
                if len(self._buffer) < target:
                    break  # the rest comes with the next chunk
                resume = self._complete(offset + i)
            elif self._mode == _REST:
                # The records, after the files: built into slabs as they come, from the
                # chunk itself (cut from it where they lie) but in the one chunk they start.
                self._writer.records(self.records, data[i:] if i else data)
                break
            else:
                take = min(self._remaining, len(view) - i)
                piece = view[i:i + take]
                self._writer.write(piece)
                self._crc = zlib.crc32(piece, self._crc)
                i += take
                self._remaining -= take
                resume = None
                if not self._remaining:
                    self._mode = _CRC
            if resume is not None:
                self._at = resume
                return resume
        self._at = offset + len(data)
        return None

    def _complete(self, at: int) -> int | None:
        """A head, a FILE or FORMAT body or a CRC is whole in the buffer (`at`: the offset
        after it)."""
        raw = bytes(self._buffer)
        self._buffer.clear()
        if self._mode == _CRC:
            return self._file_done(CRC.unpack(raw)[0], at)
        if self._mode == _BODY:
            self._mode = _HEAD
            if self._kind == FORMAT_RECORD:
                if len(raw) != _FORMAT.size or raw[0] != VERSION or self._expected >= 0:
                    raise BadCommand(f"shard snapshot format record {raw.hex()}")
                self._expected = _FORMAT.unpack(raw)[1]
            else:
                self._list(raw, at)
            if len(self._listed) < self._expected:
                return None
            # The list is whole: the files' bytes start here, one after the other.
            self._listed = [f._replace(data=f.data + at) for f in self._listed]
            # What earlier transfers left (looked up once: a file the writer is creating
            # can hold a look-up for milliseconds).
            self._kept = {path for folder in {f.staged.parent for f in self._listed}
                          for path in folder.iterdir()}
            return self._next_file(at)
        kind, length = _RECORD.unpack(raw)
        if kind == FORMAT_RECORD or (kind == FILE_RECORD
                                     and len(self._listed) < self._expected):
            self._mode, self._remaining, self._kind = _BODY, length, kind
        else:
            raise BadCommand(f"record kind {kind} out of place in a shard snapshot")
        return None

    def _list(self, body: bytes, at: int) -> None:
        try:
            generation, size, stamp = _FILE.unpack_from(body)
            name = body[_FILE.size:].decode()
        except (struct.error, UnicodeDecodeError) as error:
            raise BadCommand(f"a shipped file's record: {error}") from None
        if not name or "/" in name or name.startswith("."):
            raise BadCommand(f"a shipped file named {name!r}")
        folder = self.staging / f"gen-{generation:06d}"
        folder.mkdir(exist_ok=True)
        previous = self._listed[-1] if self._listed else None
        # Relative to the list's end until it is whole (`_complete`).
        start = previous.data + previous.size + CRC.size if previous else 0
        self._listed.append(_Listed(generation, size, folder / f"{stamp:016x}-{name}{_PART}",
                                    name, start))

    def _next_file(self, at: int) -> int | None:
        """At `at` the bytes of file `_next` would start (or, past the last, the records):
        files staged whole already are skipped, a part goes on where it ends. Returns the
        offset to resume from when it is not `at`."""
        position = at
        while self._next < len(self._listed):
            listed = self._listed[self._next]
            if listed.staged not in self._kept or not _whole(listed):
                break
            self.skipped += 1
            self._next += 1
            position = listed.data + listed.size + CRC.size
        if self._next == len(self._listed):
            self._mode = _REST
            return position if position != at else None
        listed = self._listed[self._next]
        part = listed.staged
        held = part.stat().st_size if part in self._kept and part.exists() else 0
        if held > listed.size:
            part.unlink()
            held = 0
        self._crc = 0
        if held:
            self.skipped += 1
            self._crc = _crc_of(part)
        assert self._writer is not None
        self._writer.open(part)
        self._remaining = listed.size - held
        self._mode = _DATA if self._remaining else _CRC
        position = listed.data + held
        return position if position != at else None

    def _file_done(self, expected: int, at: int) -> int | None:
        assert self._writer is not None
        listed = self._listed[self._next]
        part = listed.staged
        if self._crc != expected:
            # Damaged on the way or on this disk: fetched again, never installed.
            self._writer.discard(part)
            self._writer.drain()  # (what is on disk of it decides where it starts again)
            self.refetched += 1
            return self._next_file(-1)  # (-1: an offset that is never the one to resume at)
        self._writer.finish(part, _checked(part), self._crc)
        self._synced.add(part)
        self._next += 1
        return self._next_file(at)

    def synced(self) -> set[Path]:
        """Blocking: the files this transfer received are on disk; returns them (the ones
        kept from an earlier transfer are synced by the install). Raises what failed."""
        assert self._writer is not None
        self._writer.drain()
        return self._synced


def _checked(part: Path) -> Path:
    """Where the CRC of a file received whole and checked is kept."""
    return part.with_suffix(".crc")


def _crc_of(path: Path) -> int:
    crc = 0
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _whole(listed: _Listed) -> bool:
    """Whether an earlier transfer received the file whole, and it still matches its CRC
    (a power loss may have left anything in a file never synced)."""
    try:
        if listed.staged.stat().st_size != listed.size:
            return False
        kept = _checked(listed.staged).read_bytes()
    except FileNotFoundError:
        return False
    return kept == CRC.pack(_crc_of(listed.staged))


def install_files(fresh: Path, files: list[Shipped], staging: Path, synced: set[Path]
                  ) -> None:
    """Blocking: the received files moved into their slabs in `fresh` (built beside the
    shard, swapped in after), synced, and each slab opened once by LevelDB, which refuses
    one whose MANIFEST names a file that is not there. Raises BadCommand if one does not
    open (its files are removed, so they are fetched again)."""
    slabs: dict[int, Path] = {}
    for shipped in files:
        if shipped.staged not in synced:
            fsync_dir(shipped.staged)
        folder = slabs.setdefault(shipped.generation,
                                  fresh / f"gen-{shipped.generation:06d}")
        folder.mkdir(parents=True, exist_ok=True)
        os.replace(shipped.staged, folder / shipped.name)
    for folder in slabs.values():
        fsync_dir(folder)
    for generation, folder in slabs.items():
        try:
            plyvel.DB(str(folder), create_if_missing=False).close()
        except plyvel.Error as error:
            shutil.rmtree(staging / f"gen-{generation:06d}", ignore_errors=True)
            raise BadCommand(f"shipped generation {generation} does not open: {error}"
                             ) from None
