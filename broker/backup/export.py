"""An export: the cut (collect.py), then one pass over it on a worker thread: each member
read once (LevelDB snapshots and immutable tables), hashed as it goes out, the checksums
listed last (manifest.CHECKSUMS).

The event loop only takes the cut; the thread reads LevelDB, hashes (hashlib releases the
GIL on large chunks) and writes the archive to a `Body`: the client's socket itself, or the
loop's HTTP response where the thread cannot write the socket (body.py). A sealed table
whose checksum an earlier export of this process took is not read at all: it goes from the
page cache to the socket (`sendfile`), its kept checksum listed (tables never change; one
that did on disk, damaged, no longer matches its listed checksum, and the archive's check
fails rather than keep the damage).
"""

import asyncio
import contextlib
import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from io import FileIO
from pathlib import Path
from typing import Final, TypeVar

from broker.backup.archive import CHUNK, TarWriter, parts
from broker.backup.body import Body, SendsFiles
from broker.backup.collect import Cut, ExportFailed, Replicated, Table, collect
from broker.backup.manifest import (
    CHECKSUMS,
    NAME,
    Manifest,
    Member,
    encode_checksums,
    part_path,
)
from broker.ds import DurableStorage
from broker.formats import DATA_DIR, in_tree
from broker.retainer.store import RetainedStore
from broker.version import RELEASE

CPU_SHARE: Final = 0.1
"""The share of a core an export may take while the event loop is busy, its client's work
on the bytes counted (CLIENT_CPU_PER_MIB): after each chunk the thread sleeps in proportion
to the CPU time the chunk took, its own and its client's. The node's event loop, which
serves the publishers, needs the GIL and a core meanwhile: an export must not take them
from it (issue 39: the publishers keep 80% of their rate; bench/backup_bench.py). At 0.2
of a core for the thread alone, its client's work not counted, the publishers kept
0.60-0.85 of their rate (side by side on a crowded 2-core machine, load 6-8), at 0.1
with it counted 0.77-0.93 (bench/README.md, "Backup benchmark")."""
CLIENT_CPU_PER_MIB: Final = 0.002
"""CPU-seconds a client on this machine spends on each MiB it receives: `ctl data export`
checks it (SHA-256) and writes it, 1.8-2.1 ms per MiB measured (its start included, on the
benchmark's machine). On a shared machine (a scheduled export's pod may land on the
node's) that CPU comes from the cores the loop needs; the node cannot measure it, so it
counts it as this."""
LOOP_BUSY: Final = 0.5
"""The event loop's demand for a core (Pace) from which the export paces itself: below it
the loop has CPU to spare and the export goes at full speed (sealed tables sent by the
kernel, current generations read and hashed mostly in C), the CPU left to the loop within
WINDOW_S of its work growing. Half a core: publishers that lose a fifth of their rate to
an export keep a busy loop well above it (bench/backup_bench.py), and an idle loop on a
crowded machine (its timers, and the time it waits for a core) well below it."""
WINDOW_S: Final = 0.1
DIGESTS_KEPT: Final = 100_000  # sealed tables whose checksums a node keeps (LRU)
OpenBody = Callable[[bytes, Callable[[], bool]], Body]
"""(the manifest member, whether the export was cancelled) -> where the archive goes; called
on the export's thread before any byte goes out (an HTTP response sends the manifest's
SHA-256 as a header)."""
T = TypeVar("T")
Identity = tuple[int, int, int, int]  # a file's device, inode, size, modification time


class _Digests:
    """The SHA-256 of sealed tables this process has exported, by file identity (tables
    never change: a scheduled export reads only those sealed since the last)."""

    def __init__(self) -> None:
        self._known: OrderedDict[Identity, str] = OrderedDict()
        self._lock = threading.Lock()  # (exports of several nodes in one process: tests)

    def get(self, identity: Identity) -> str | None:
        with self._lock:
            sha = self._known.get(identity)
            if sha is not None:
                self._known.move_to_end(identity)
            return sha

    def keep(self, identity: Identity, sha: str) -> None:
        with self._lock:
            self._known[identity] = sha
            while len(self._known) > DIGESTS_KEPT:
                self._known.popitem(last=False)


_DIGESTS: Final = _Digests()


class Pace:
    """Paces the export's thread while the event loop's thread (`loop_thread`: its native
    ID) is busy: its demand for a core over the last WINDOW_S (the CPU time it got and the
    time it waited for one, from /proc's schedstat: on a crowded machine a busy loop gets
    little CPU, and waits) at LOOP_BUSY or more. Unknown (no /proc): always busy."""

    def __init__(self, loop_thread: int | None) -> None:
        self._stat = (Path(f"/proc/self/task/{loop_thread}/schedstat")
                      if loop_thread is not None else None)
        self._busy = True
        self._since = (time.monotonic(), self._demand())

    def _demand(self) -> float | None:
        if self._stat is None:
            return None
        try:
            ran, waited, _ = self._stat.read_text().split()
            return (int(ran) + int(waited)) / 1e9
        except (OSError, ValueError):  # its thread ended (the node stops), or no schedstat
            return None

    def _loop_busy(self) -> bool:
        wall = time.monotonic()
        since, demanded = self._since
        if wall - since >= WINDOW_S:
            demand = self._demand()
            self._busy = (demand is None or demanded is None
                          or demand - demanded >= LOOP_BUSY * (wall - since))
            self._since = (wall, demand)
        return self._busy

    def __call__(self, chunks: Iterable[T], size: Callable[[T], int]) -> Iterator[T]:
        """`chunks` as they come, the thread sleeping after each while the loop is busy;
        `size`: the bytes a chunk holds (its client's share of the work)."""
        worked = time.thread_time()
        for chunk in chunks:
            yield chunk
            now = time.thread_time()
            if self._loop_busy():
                cost = now - worked + size(chunk) * CLIENT_CPU_PER_MIB / (1 << 20)
                time.sleep(cost * (1 / CPU_SHARE - 1))
            worked = time.thread_time()


def build_manifest(cut: Cut, members: list[Member], created_us: int,
                   since_us: int | None) -> Manifest:
    created = datetime.fromtimestamp(created_us / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return Manifest(RELEASE, created, created_us, since_us, cut.cluster,
                    {fmt.name: fmt.version for fmt in in_tree(DATA_DIR)}, cut.cut,
                    tuple(cut.generations), tuple(members))


def write_archive(cut: Cut, open_body: OpenBody, created_us: int, since_us: int | None,
                  gzip: bool = False, stopped: Callable[[], bool] = lambda: False,
                  loop_thread: int | None = None) -> tuple[Manifest, int]:
    """Blocking (a worker thread): the archive; returns its manifest (with its files) and
    the bytes written. `loop_thread`: the event loop's native thread ID, which the export
    yields to while it is busy (Pace)."""
    paced = Pace(loop_thread)
    cut.expand_sealed()
    manifest = build_manifest(cut, [], created_us, since_us)
    raw = manifest.encode()
    body = open_body(raw, stopped)
    try:
        writer = TarWriter(body.write, gzip)
        writer.add(NAME, len(raw), (raw,))
        files = body if isinstance(body, SendsFiles) and not gzip else None
        members: list[Member] = []
        for source in cut.sources:
            if stopped():
                raise ExportFailed("the export was cancelled")
            if isinstance(source, Table):
                members.append(_add_table(writer, source, files, paced))
            elif source.size is not None:
                members.append(_add(writer, source.path, source.size,
                                    paced(source.read(), len)))
            else:
                for n, part in enumerate(parts(paced(source.read(), len))):
                    members.append(_add(writer, part_path(source.path, n),
                                        sum(map(len, part)), part))
        checksums = encode_checksums(members, raw)
        writer.add(CHECKSUMS, len(checksums), (checksums,))
        writer.close()
    except BaseException:
        with contextlib.suppress(Exception):  # the error says why: not the body's echo of it
            body.close()
        raise
    body.close()
    return build_manifest(cut, members, created_us, since_us), writer.bytes


def _add_table(writer: TarWriter, table: Table, files: SendsFiles | None,
               paced: Pace) -> Member:
    """A sealed table, from the file opened once (retention may unlink it meanwhile: what is
    open stays readable): sent by `files` from the page cache if its checksum is kept, else
    read, hashed and written, and its checksum kept."""
    try:
        file = FileIO(table.file, "r")
    except FileNotFoundError:
        raise ExportFailed(f"{table.file} went away during the export (retention dropped its"
                           f" generation?): export again") from None
    with file:
        stat = os.fstat(file.fileno())
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        sha = _DIGESTS.get(identity)
        if sha is not None and files is not None:
            writer.add_sent(table.path, table.size,
                            paced(files.send_file(file.fileno(), table.size), int))
            return Member(table.path, table.size, sha)
        member = _add(writer, table.path, table.size, paced(_read(file), len))
    _DIGESTS.keep(identity, member.sha256)
    return member


def _read(file: FileIO) -> Iterator[memoryview]:
    """The file a CHUNK at a time into one buffer: each piece is hashed and written (a body
    that keeps it copies it) before the next is read."""
    buffer = memoryview(bytearray(CHUNK))
    while read := file.readinto(buffer):
        yield buffer[:read]


def _add(writer: TarWriter, path: str, size: int,
         chunks: Iterable[bytes | memoryview]) -> Member:
    """A member written, hashed on the way."""
    sha = hashlib.sha256()

    def hashed() -> Iterator[bytes | memoryview]:
        for chunk in chunks:
            sha.update(chunk)
            yield chunk
    writer.add(path, size, hashed())
    return Member(path, size, sha.hexdigest())


async def export(ds: DurableStorage, retainer: RetainedStore | None,
                 groups: Replicated | None, since_us: int | None, open_body: OpenBody,
                 gzip: bool = False) -> tuple[Manifest, int]:
    """The archive of everything durable, at one cut, to the body `open_body` gives (called
    on a worker thread). Its own thread: the storage's pool serves the brokers' writes
    meanwhile. Cancelled, the thread stops at its next member (or wait for room in the
    socket); the cut's snapshots are released once it has."""
    cut = await collect(ds, retainer, groups, since_us)
    created_us = time.time_ns() // 1000
    stop = threading.Event()
    pool = ThreadPoolExecutor(1, thread_name_prefix="backup")
    try:
        done = asyncio.get_running_loop().run_in_executor(
            pool, write_archive, cut, open_body, created_us, since_us, gzip, stop.is_set,
            threading.get_native_id())
    except BaseException:
        cut.release()
        raise
    done.add_done_callback(lambda _: cut.release())
    pool.shutdown(wait=False)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        raise
