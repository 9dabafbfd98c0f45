"""A shard's (and the sessions database's) snapshot as records: written by a dump, read
back by an install (the format: broker/ds/replication_shard.py's docstring).

    record   := kind:u8  length:u32  bytes
"""

import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Final

from broker.ds.manifest import NAME as MANIFEST
from broker.ds.open_slabs import OpenSlabs
from broker.ds.replication_layer import BadCommand
from broker.ds.shipped import format_record, link_sealed, write_files
from broker.ds.slab import Slab
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


def split_pair(body: bytes) -> tuple[bytes, bytes]:
    (klen,) = _U32.unpack_from(body)
    return body[4:4 + klen], body[4 + klen:]


def pairs(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """The key/value pairs of a sessions snapshot, read as they are consumed (a generator
    function: mypyc makes a list of a generator expression passed as an argument)."""
    for kind, body in records(path):
        if kind == PAIR_RECORD:
            yield split_pair(body)


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
