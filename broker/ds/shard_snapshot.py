"""A shard's (and the sessions database's) snapshot as records: written by a dump, read
back by an install (the format: broker/ds/replication_shard.py's docstring).

    record   := kind:u8  length:u32  bytes
"""

import shutil
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Final

from broker.ds.bulk import Build
from broker.ds.manifest import NAME as MANIFEST
from broker.ds.open_slabs import OpenSlabs
from broker.ds.replication_layer import BadCommand
from broker.ds.shard import checkpoint_at, generation_dir
from broker.ds.shipped import format_record, link_sealed, write_files
from broker.ds.slab import CHECKPOINT_KEY, Compression, Slab
from broker.raft.spool import FILE_BUFFER, DumpStopped, Insert, Splice

_RECORD: Final = struct.Struct(">BI")
_HEAD: Final = _RECORD.size  # (compiled, `_RECORD.size` is an attribute lookup each time)
SLAB: Final = struct.Struct(">QQQ")
_U32: Final = struct.Struct(">I")
_PAIR_HEAD: Final = struct.Struct(">BII")  # a pair record's head and its key's length
SLAB_RECORD: Final = 1
PAIR_RECORD: Final = 2


def _record(kind: int, data: bytes) -> bytes:
    return _RECORD.pack(kind, len(data)) + data


def _u32(data: bytes, at: int) -> int:
    """The big-endian u32 at `at`: four byte reads, compiled, where struct's unpack_from
    is a call that makes a tuple."""
    return data[at] << 24 | data[at + 1] << 16 | data[at + 2] << 8 | data[at + 3]


class Framing:
    """The one reader of the record framing: records in pieces cut anywhere (a transfer's
    chunks, a file's reads) handed whole to the subclass's `take` where they lie in the
    piece; only a record a piece's end cuts is put together (copying every byte into a
    buffer first, then out of it, cost the receiver's writer thread a copy of each chunk
    and a move of its rest). `take` is a method, which compiled code calls directly: with a
    callback, and each head unpacked by struct, SlabBuilder took 116-147 ms of CPU for a
    catch-up's 88,000 pairs (15.3 MiB), against 55-65 ms so (native, min of 5)."""

    def __init__(self) -> None:
        self._cut = bytearray()  # a record's start that the last piece's end cut off
        self._whole = 0  # that record's size, once its head is in `_cut` (0: not yet)

    def take(self, kind: int, data: bytes, start: int, stop: int) -> None:
        """A whole record, its body data[start:stop]."""
        raise NotImplementedError

    def feed(self, data: bytes) -> None:
        at = 0
        size = len(data)
        if self._cut:
            at = self._join(data)
            if at < 0:
                return
        while size - at >= _HEAD:
            stop = at + _HEAD + _u32(data, at + 1)
            if stop > size:
                break
            self.take(data[at], data, at + _HEAD, stop)
            at = stop
        if at < size:
            self._cut += data[at:]
            self._whole = 0

    def _join(self, data: bytes) -> int:
        """The cut record completed from `data`'s start and handed over: returns where in
        `data` the next one starts (-1: `data` ends before the record does)."""
        cut = self._cut
        at = 0
        if not self._whole:
            if len(cut) < _HEAD:
                at = _HEAD - len(cut)
                cut += data[:at]
                if len(cut) < _HEAD:
                    return -1
            self._whole = _HEAD + _RECORD.unpack_from(cut)[1]
        rest = self._whole - len(cut)
        if rest > len(data) - at:
            cut += data[at:]
            return -1
        cut += data[at:at + rest]
        record = bytes(cut)
        cut.clear()
        self._whole = 0
        self.take(record[0], record, _HEAD, len(record))
        return at + rest

    def end(self) -> None:
        """Raises BadCommand if the stream ended inside a record."""
        if self._cut:
            raise BadCommand("a snapshot cut short in a record")


def split_pair(data: bytes, start: int, stop: int) -> tuple[bytes, bytes]:
    """A pair record's key and value, its body data[start:stop]."""
    key_end = start + 4 + _u32(data, start)
    return data[start + 4:key_end], data[key_end:stop]


class _Pairs(Framing):
    """The pairs of the records fed, gathered in `read`."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[tuple[bytes, bytes]] = []

    def take(self, kind: int, data: bytes, start: int, stop: int) -> None:
        if kind == PAIR_RECORD:
            self.read.append(split_pair(data, start, stop))


def pairs(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """The key/value pairs of a sessions snapshot, read as they are consumed (a generator
    function: mypyc makes a list of a generator expression passed as an argument)."""
    framing = _Pairs()
    with path.open("rb", buffering=0) as file:
        while piece := file.read(FILE_BUFFER):
            framing.feed(piece)
            yield from framing.read
            framing.read.clear()
    framing.end()


class SlabBuilder(Framing):
    """A shard snapshot's slabs built in `directory` from its records as they come, in
    pieces cut anywhere (a version 2 transfer's, chunk by chunk, on the receiver's writer
    thread, while the rest arrives; version 1's from the received file), then `finish`ed
    once the snapshot is whole. Blocking. Each slab is written as tables, synced
    (bulk.Build: the dump's pairs come in key order): the shard's reopen, on the event loop
    once the install swaps it in, then has no log to read back (the current generation's,
    up to `generation_max_size`). The current slab's checkpoint, in the dump among its first
    keys, is written again at `finish` with the snapshot's index (a `late` pair)."""

    def __init__(self, directory: Path, compression: Compression) -> None:
        super().__init__()
        self.directory = directory
        self._compression = compression
        shutil.rmtree(directory, ignore_errors=True)  # an earlier transfer's
        directory.mkdir(parents=True)
        self._build: Build | None = None  # the open slab's
        self._checkpoint: bytes | None = None  # the last slab's (the current one)
        self._sealed: list[tuple[Path, int, int]] = []

    def take(self, kind: int, data: bytes, start: int, stop: int) -> None:
        if kind == PAIR_RECORD and self._build is not None:
            key, value = split_pair(data, start, stop)
            self._build.put(key, value)
            if key == CHECKPOINT_KEY:
                self._checkpoint = value
        elif kind == SLAB_RECORD:
            if self._build is not None:
                self._written([])
            self._checkpoint = None
            generation, _created, sealed_at = SLAB.unpack_from(data, start)
            path = generation_dir(self.directory, generation)
            self._build = Build(path, self._compression)
            if sealed_at:
                self._sealed.append((path, generation, sealed_at))
        else:
            raise BadCommand(f"record kind {kind} out of place in a shard snapshot")

    def finish(self, shard: int, index: int, term: int, last: list[tuple[bytes, bytes]]
               ) -> None:
        """The last slab's checkpoint (at `index`, `term`) and `last` written, every slab
        closed, the sealed ones sealed."""
        self.end()
        if self._build is None:  # a shard always has a current generation
            raise BadCommand("a shard snapshot without a generation")
        self._written([(CHECKPOINT_KEY, checkpoint_at(self._checkpoint, index, term)), *last])
        for path, generation, until in self._sealed:
            slab = Slab.open(path, generation, self._compression)
            slab.seal(until, shard)
            slab.close()

    def close(self) -> None:
        """An unfinished build given up: what it wrote goes."""
        if self._build is not None:
            self._build.close()
            self._build = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def _written(self, last: list[tuple[bytes, bytes]]) -> None:
        build = self._build
        assert build is not None
        self._build = None
        try:
            build.finish(last)
        except BaseException:
            build.close()
            raise


def write_slabs(file: IO[bytes], stop: threading.Event, slabs: list[tuple[Slab, int]],
                 current: Slab, view: Any, open_slabs: OpenSlabs, thresholds: bytes) -> None:
    for slab, sealed_at in slabs:
        file.write(_record(SLAB_RECORD, SLAB.pack(slab.generation, slab.created,
                                                     sealed_at) + thresholds))
        if slab is current:
            write_pairs(file, stop, view.iterator())
            continue
        open_slabs.acquire(slab)
        try:
            write_pairs(file, stop, slab.db.iterator())
        finally:
            open_slabs.release(slab)


def write_slabs_and_files(file: IO[bytes], stop: threading.Event, splice: Splice,
                           slabs: list[tuple[Slab, int]], current: Slab, view: Any,
                           open_slabs: OpenSlabs, thresholds: bytes, links: Path
                           ) -> list[Insert]:
    """Version 2 (shipped.py): the slabs sealed on disk (their manifest written: the seal's
    compaction is over) as their files, then the others as in version 1. The files are
    spliced in before the others are written: they leave while those are dumped."""
    files: list[tuple[int, str, Path]] = []
    rest: list[tuple[Slab, int]] = []
    for slab, sealed_at in slabs:
        if slab is current or not sealed_at or not (slab.path / MANIFEST).exists():
            rest.append((slab, sealed_at))
            continue
        if stop.is_set():
            raise DumpStopped
        with slab.steady():
            linked = link_sealed(slab.path, links / slab.path.name)
        files += [(slab.generation, name, path) for name, path in linked]
    file.write(format_record(len(files)))
    inserts = write_files(file, files)
    if inserts:
        splice(inserts)
    write_slabs(file, stop, rest, current, view, open_slabs, thresholds)
    return inserts


def write_pairs(file: IO[bytes], stop: threading.Event, items: Any,
                 skip: frozenset[bytes] = frozenset()) -> None:
    """The pairs as records, gathered FILE_BUFFER at a time (a record and its head made and
    joined as bytes objects per pair, then copied into the file's buffer, held the leader's
    interpreter lock three times as long as the loop's chunks wait for it)."""
    out = bytearray()
    pack = _PAIR_HEAD.pack
    try:
        for n, (key, value) in enumerate(items):
            if not n % 1024 and stop.is_set():
                raise DumpStopped
            if key not in skip:
                out += pack(PAIR_RECORD, _U32.size + len(key) + len(value), len(key))
                out += key
                out += value
                if len(out) >= FILE_BUFFER:
                    file.write(out)
                    out.clear()
        file.write(out)
    finally:
        items.close()
