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

import plyvel  # type: ignore[import-untyped]

from broker.ds.bulk import BUILD_BUFFER, Batches, write_out
from broker.ds.files import fsync_dir
from broker.ds.manifest import NAME as MANIFEST
from broker.ds.open_slabs import OpenSlabs
from broker.ds.replication_layer import BadCommand
from broker.ds.shard import checkpoint_at, generation_dir
from broker.ds.shipped import format_record, link_sealed, write_files
from broker.ds.slab import CHECKPOINT_KEY, Compression, Slab
from broker.raft.spool import FILE_BUFFER, DumpStopped, Insert, Splice

_RECORD: Final = struct.Struct(">BI")
SLAB: Final = struct.Struct(">QQQ")
_U32: Final = struct.Struct(">I")
SLAB_RECORD: Final = 1
PAIR_RECORD: Final = 2


def _record(kind: int, data: bytes) -> bytes:
    return _RECORD.pack(kind, len(data)) + data


def _pair(key: bytes, value: bytes) -> bytes:
    return _record(PAIR_RECORD, _U32.pack(len(key)) + key + value)


def records(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb", buffering=FILE_BUFFER) as file:
        while head := file.read(_RECORD.size):
            if len(head) < _RECORD.size:
                raise BadCommand("a snapshot cut short in a record's head")
            kind, length = _RECORD.unpack(head)
            body = file.read(length)
            if len(body) < length:
                raise BadCommand("a snapshot cut short in a record")
            yield kind, body


def split_pair(body: bytes | memoryview) -> tuple[bytes, bytes]:
    """A pair record's key and value (as bytes: `bytes` of a bytes slice copies nothing)."""
    (klen,) = _U32.unpack_from(body)
    return bytes(body[4:4 + klen]), bytes(body[4 + klen:])


def pairs(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """The key/value pairs of a sessions snapshot, read as they are consumed (a generator
    function: mypyc makes a list of a generator expression passed as an argument)."""
    for kind, body in records(path):
        if kind == PAIR_RECORD:
            yield split_pair(body)


class SlabBuilder:
    """A shard snapshot's slabs built in `directory` from its records as they come, in
    pieces cut anywhere (a version 2 transfer's, chunk by chunk, on the receiver's writer
    thread, while the rest arrives; version 1's from the received file), then `finish`ed
    once the snapshot is whole. Blocking. Each slab is written out as tables, synced, before
    it is closed (bulk.write_out): the shard's reopen, on the event loop once the install
    swaps it in, then has no log to read back (the current generation's, up to
    `generation_max_size`), and the logs need no sync."""

    def __init__(self, directory: Path, compression: Compression) -> None:
        self.directory = directory
        self._compression = compression
        shutil.rmtree(directory, ignore_errors=True)  # an earlier transfer's
        directory.mkdir(parents=True)
        self._buffer = bytearray()  # a record not whole yet
        self._batches: Batches | None = None  # the open slab's
        self._path = directory  # the open slab's
        self._checkpoint: bytes | None = None  # the last slab's (the current one)
        self._sealed: list[tuple[Path, int, int]] = []

    def feed(self, data: bytes | memoryview) -> None:
        buffer = self._buffer
        buffer += data
        at, end = 0, len(buffer)
        with memoryview(buffer) as view:
            while end - at >= _RECORD.size:
                kind, length = _RECORD.unpack_from(view, at)
                stop = at + _RECORD.size + length
                if stop > end:
                    break
                self._record(kind, view, at + _RECORD.size, stop)
                at = stop
        del buffer[:at]

    def _record(self, kind: int, view: memoryview, at: int, stop: int) -> None:
        if kind == PAIR_RECORD and self._batches is not None:
            key, value = split_pair(view[at:stop])
            self._batches.put(key, value)
            if key == CHECKPOINT_KEY:
                self._checkpoint = value
        elif kind == SLAB_RECORD:
            if self._batches is not None:
                self._written([])
            self._checkpoint = None
            generation, _created, sealed_at = SLAB.unpack_from(view, at)
            self._path = generation_dir(self.directory, generation)
            self._batches = Batches(plyvel.DB(str(self._path), create_if_missing=True,
                                              compression=self._compression,
                                              write_buffer_size=BUILD_BUFFER))
            if sealed_at:
                self._sealed.append((self._path, generation, sealed_at))
        else:
            raise BadCommand(f"record kind {kind} out of place in a shard snapshot")

    def finish(self, shard: int, index: int, term: int, last: list[tuple[bytes, bytes]]
               ) -> None:
        """The last slab's checkpoint (at `index`, `term`) and `last` written, every slab
        closed, the sealed ones sealed."""
        if self._buffer:
            raise BadCommand("a snapshot cut short in a record")
        if self._batches is None:  # a shard always has a current generation
            raise BadCommand("a shard snapshot without a generation")
        self._written([(CHECKPOINT_KEY, checkpoint_at(self._checkpoint, index, term)), *last])
        for path, generation, until in self._sealed:
            slab = Slab.open(path, generation, self._compression)
            slab.seal(until, shard)
            slab.close()

    def close(self) -> None:
        """An unfinished build given up: what it wrote goes."""
        if self._batches is not None:
            self._batches.db.close()
            self._batches = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def _written(self, last: list[tuple[bytes, bytes]]) -> None:
        assert self._batches is not None
        self._batches.finish(last, sync=False)
        write_out(self._batches.db)
        self._batches = None
        fsync_dir(self._path)  # (LevelDB syncs the tables and manifest, not their entries)


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
    try:
        for n, (key, value) in enumerate(items):
            if not n % 1024 and stop.is_set():
                raise DumpStopped
            if key not in skip:
                file.write(_pair(key, value))
    finally:
        items.close()
