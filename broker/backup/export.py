"""An export: the cut (collect.py), then one pass over it on a worker thread: each member
read once (LevelDB snapshots and immutable tables), hashed as it goes out, the checksums
listed last (manifest.CHECKSUMS).

The event loop only takes the cut; the thread reads LevelDB, hashes (hashlib releases the
GIL on large chunks) and hands the archive's chunks to `sink`, which may block (a file) or
wait for the loop (an HTTP response: backpressure).
"""

import asyncio
import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from broker.backup.archive import Sink, TarWriter, parts
from broker.backup.collect import Cut, ExportFailed, Replicated, collect
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

CPU_SHARE: Final = 0.2
"""The share of a core the export's thread may use while the event loop is busy: after each
chunk it sleeps in proportion to the CPU time the chunk took. The node's event loop, which
serves the publishers, needs the GIL and a core meanwhile: an export must not take them
from it (issue 39: the publishers keep 80% of their rate; bench/backup_bench.py)."""
LOOP_BUSY: Final = 0.5
"""The event loop's demand for a core (Pace) from which the export paces itself: below it
the loop has CPU to spare and the export goes at full speed (the archive's bytes are
mostly tables read and hashed in C), the CPU left to the loop within WINDOW_S of its
work growing. Half a core: streaming the archive alone makes the loop demand a tenth or
more of one on a crowded machine (its writes, and the time it waits for a core), which is
not a client to make room for; publishers that lose a fifth of their rate to an export
keep a busy loop well above it (bench/backup_bench.py)."""
WINDOW_S: Final = 0.1
OnManifest = Callable[[bytes], None]


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

    def __call__(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        worked = time.thread_time()
        for chunk in chunks:
            yield chunk
            now = time.thread_time()
            if self._loop_busy():
                time.sleep((now - worked) * (1 / CPU_SHARE - 1))
            worked = time.thread_time()


def build_manifest(cut: Cut, members: list[Member], created_us: int,
                   since_us: int | None) -> Manifest:
    created = datetime.fromtimestamp(created_us / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return Manifest(RELEASE, created, created_us, since_us, cut.cluster,
                    {fmt.name: fmt.version for fmt in in_tree(DATA_DIR)}, cut.cut,
                    tuple(cut.generations), tuple(members))


def write_archive(cut: Cut, sink: Sink, created_us: int, since_us: int | None,
                  gzip: bool = False, stopped: Callable[[], bool] = lambda: False,
                  on_manifest: OnManifest = lambda raw: None,
                  loop_thread: int | None = None) -> tuple[Manifest, int]:
    """Blocking (a worker thread): the archive; returns its manifest (with its files) and
    the bytes written. `on_manifest` gets the manifest member before any byte goes to
    `sink` (an HTTP response sends its SHA-256 as a header); `loop_thread`: the event
    loop's native thread ID, which the export yields to while it is busy (Pace)."""
    paced = Pace(loop_thread)
    cut.expand_sealed()
    manifest = build_manifest(cut, [], created_us, since_us)
    raw = manifest.encode()
    on_manifest(raw)
    writer = TarWriter(sink, gzip)
    writer.add(NAME, len(raw), (raw,))
    members: list[Member] = []
    for source in cut.sources:
        if stopped():
            raise ExportFailed("the export was cancelled")
        if source.size is not None:
            members.append(_add(writer, source.path, source.size, paced(source.read())))
            continue
        for n, part in enumerate(parts(paced(source.read()))):
            members.append(_add(writer, part_path(source.path, n), sum(map(len, part)), part))
    checksums = encode_checksums(members, raw)
    writer.add(CHECKSUMS, len(checksums), (checksums,))
    writer.close()
    return build_manifest(cut, members, created_us, since_us), writer.bytes


def _add(writer: TarWriter, path: str, size: int, chunks: Iterable[bytes]) -> Member:
    """A member written, hashed on the way."""
    sha = hashlib.sha256()

    def hashed() -> Iterator[bytes]:
        for chunk in chunks:
            sha.update(chunk)
            yield chunk
    writer.add(path, size, hashed())
    return Member(path, size, sha.hexdigest())


async def export(ds: DurableStorage, retainer: RetainedStore | None,
                 groups: Replicated | None, since_us: int | None, sink: Sink,
                 gzip: bool = False, on_manifest: OnManifest = lambda raw: None,
                 ) -> tuple[Manifest, int]:
    """The archive of everything durable, at one cut, to `sink` (called on a worker thread).
    Its own thread: the storage's pool serves the brokers' writes meanwhile. Cancelled, the
    thread stops at its next member; the cut's snapshots are released once it has."""
    cut = await collect(ds, retainer, groups, since_us)
    created_us = time.time_ns() // 1000
    stop = threading.Event()
    pool = ThreadPoolExecutor(1, thread_name_prefix="backup")
    try:
        done = asyncio.get_running_loop().run_in_executor(
            pool, write_archive, cut, sink, created_us, since_us, gzip, stop.is_set,
            on_manifest, threading.get_native_id())
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
