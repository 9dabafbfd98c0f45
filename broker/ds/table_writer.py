"""A LevelDB database written from pairs in key order, without LevelDB's write path.

A database built from pairs already sorted (a catch-up's slabs, shard_snapshot.py) went
through LevelDB as any write does: its log, its memtable, a table at each flush, then
level-0 compactions that read and rewrote those tables. Here the pairs are written once, as
the tables LevelDB would end up with, and the manifest that lists them; LevelDB opens the
directory as its own. The formats are LevelDB's (google/leveldb, doc/table_format.md,
doc/log_format.md, db/version_edit.cc, db/dbformat.h):

    directory   000002.ldb ... (tables), MANIFEST-000001, CURRENT ("MANIFEST-000001\\n")

    table       data block* metaindex-block index-block footer
    block       entry* restart:u32le* n_restarts:u32le, then a 5-byte trailer:
                type:u8 (0: not compressed) masked-crc32c(block + type):u32le
    entry       shared:varint32 unshared:varint32 value_length:varint32
                key[shared:] value     (key: an internal key, below; `shared` bytes taken
                                        from the entry before; 0 at every restart point)
    data block  ~BLOCK_BYTES of entries, a restart point every RESTART_INTERVAL entries
    metaindex   an empty block: no filter policy (the broker opens its databases with none)
    index       one entry per data block, restart point at each: key >= the block's last
                key and < the next block's first (its last key here), value a handle
    handle      offset:varint64 size:varint64     (size without the trailer)
    footer      metaindex-handle index-handle, zero-padded to 40 bytes,
                magic 0xdb4775248b80fb57:u64le

    internal key   user key + ((sequence << 8) | type):u64le, type 1 (a value)

    MANIFEST    log records of one VersionEdit: 32 KiB blocks of
                masked-crc32c(type + data):u32le length:u16le type:u8 data
                (type 1 full, 2 first, 3 middle, 4 last; a block's tail under 7 bytes
                zeroed), the edit being tag:varint32 then its field:
                1 comparator (length-prefixed "leveldb.BytewiseComparator"),
                2 log number, 3 next file number, 4 last sequence (varint64 each),
                7 new file: level:varint32 number:varint64 size:varint64
                  smallest, largest (length-prefixed internal keys)

    masked crc  ((crc >> 15 | crc << 17) + 0xa282ead8) mod 2**32 (crc32c.h's Mask)

Where the tables go: the deepest level, LEVEL (6). LevelDB compacts a level past its byte
budget into the next (L1 10 MB, x10 each level down; the deepest has none), and level 0
past 4 files; a file at the deepest level is not even charged for the seeks that miss it
(version_set.cc: a lookup charges the first file it read when it had to read another, and
nothing lies below). So tables of a few MiB in sorted, non-overlapping runs stay as they
are written until newer writes compact down onto the range they share, as RocksDB's
external file ingestion places such files at the bottommost level. At L1 a generation past
10 MB would be moved down level by level at once, a manifest write a file.

The pairs must come in strictly increasing key order: `add` refuses one that does not
(bulk.Build then continues through LevelDB's write path on what was written). Pairs known
only at the end that belong anywhere (a catch-up's checkpoint, rewritten once the snapshot
is whole) are `finish`'s `late` ones: past the last key they end the run; otherwise they
make a table of their own at level 0 with a newer sequence number, which LevelDB reads
before the deeper levels, as it would read a newer write (its next compaction merges them).

Blocks are not compressed: LevelDB reads plain blocks whatever a database's `compression`
(bulk.Build writes here only for databases configured without: no snappy binding is
installed). A crash before CURRENT is written leaves a directory LevelDB does not take for
a database (and whose files it deletes if it creates one there).
"""

import os
import struct
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Final

from crc32c import crc32c

from broker.direct import DirectFile, aligned_buffer
from broker.ds.files import fsync_dir

LEVEL: Final = 6  # LevelDB's kNumLevels - 1: see the module docstring
LATE_LEVEL: Final = 0
BLOCK_BYTES: Final = 4096  # LevelDB's default block_size
RESTART_INTERVAL: Final = 16  # LevelDB's default block_restart_interval
TABLE_BYTES: Final = 2 << 20  # LevelDB's max_file_size: the tables its compactions write
_SEQUENCE: Final = 1  # every pair of the sorted run
_LATE_SEQUENCE: Final = 2  # `late` pairs: newer than the run
_VALUE: Final = 1  # kTypeValue
_MAGIC: Final = struct.pack("<Q", 0xdb4775248b80fb57)
_FOOTER_HANDLES: Final = 40
_NOT_COMPRESSED: Final = b"\x00"
_CRC_MASK_DELTA: Final = 0xa282ead8
_U32: Final = struct.Struct("<I")
_LOG_HEAD: Final = struct.Struct("<IHB")
_LOG_BLOCK: Final = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_COMPARATOR: Final = b"leveldb.BytewiseComparator"
_TAG_COMPARATOR, _TAG_LOG_NUMBER, _TAG_NEXT_FILE, _TAG_LAST_SEQUENCE = 1, 2, 3, 4
_TAG_NEW_FILE: Final = 7
_MANIFEST_NUMBER: Final = 1


def trailer(sequence: int) -> bytes:
    """What makes a user key an internal key (dbformat.h: PackSequenceAndType)."""
    return struct.pack("<Q", sequence << 8 | _VALUE)


def masked(crc: int) -> int:
    """crc32c.h's Mask: a CRC stored next to data that is itself checksummed later would
    otherwise be hard to tell from it."""
    return ((crc >> 15 | crc << 17) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def put_varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)


def _prefixed(out: bytearray, data: bytes) -> None:
    put_varint(out, len(data))
    out += data


class _Table:
    """One table file's bytes, built in memory (TABLE_BYTES and a block), entries in order."""

    def __init__(self, key_trailer: bytes) -> None:
        self.trailer = key_trailer
        self.out = bytearray()  # finished blocks, with their trailers
        self.smallest = b""  # user keys
        self.largest = b""
        self.entries = 0
        self._index = bytearray()
        self._index_restarts: list[int] = []
        self._block = bytearray()
        self._restarts: list[int] = [0]
        self._counter = 0  # entries since the last restart point
        self._previous = b""  # the block's last user key (b"" at its start)

    def add(self, key: bytes, value: bytes) -> None:
        block = self._block
        previous = self._previous
        shared = 0
        if self._counter < RESTART_INTERVAL:
            limit = min(len(key), len(previous))
            while shared < limit and key[shared] == previous[shared]:
                shared += 1
        else:
            self._restarts.append(len(block))
            self._counter = 0
        self._counter += 1
        put_varint(block, shared)
        put_varint(block, len(key) - shared + 8)
        put_varint(block, len(value))
        block += key[shared:] if shared else key
        block += self.trailer
        block += value
        self._previous = key
        if not self.entries:
            self.smallest = key
        self.largest = key
        self.entries += 1
        if len(block) + 4 * len(self._restarts) + 4 >= BLOCK_BYTES:
            self.end_block()

    def end_block(self) -> None:
        """The open data block written, and its index entry."""
        if not self._block:
            return
        handle = self._write_block(self._block, self._restarts)
        # The block's last key is >= its keys and < the next block's first, which is all
        # the index needs (LevelDB's shortest separator only makes the index smaller).
        self._index_restarts.append(len(self._index))
        put_varint(self._index, 0)
        put_varint(self._index, len(self.largest) + 8)
        put_varint(self._index, len(handle))
        self._index += self.largest
        self._index += self.trailer
        self._index += handle
        self._block = bytearray()
        self._restarts = [0]
        self._counter = 0
        self._previous = b""

    def finish(self) -> bytearray:
        """The whole file: the open block, the metaindex and index blocks, the footer."""
        self.end_block()
        metaindex = self._write_block(bytearray(), [0])
        index = self._write_block(self._index, self._index_restarts or [0])
        footer = metaindex + index
        self.out += footer
        self.out += bytes(_FOOTER_HANDLES - len(footer))
        self.out += _MAGIC
        return self.out

    def _write_block(self, block: bytearray, restarts: list[int]) -> bytes:
        """Appends the block (restart array, trailer added) to the file; its handle."""
        block += struct.pack(f"<{len(restarts)}I", *restarts)
        block += _U32.pack(len(restarts))
        offset = len(self.out)
        self.out += block
        self.out += _NOT_COMPRESSED
        self.out += _U32.pack(masked(crc32c(_NOT_COMPRESSED, crc32c(block))))
        handle = bytearray()
        put_varint(handle, offset)
        put_varint(handle, len(block))
        return bytes(handle)


class TableWriter:
    """Writes the database at `path` (a directory it creates: it must not exist) from pairs
    added in strictly increasing key order, then `finish`ed (or `close`d, given up).
    Blocking. With `sync` every file and the directory are synced before `finish` returns;
    without, the caller syncs the tree (files.sync_tree) or throws it away.

    A finished table is written (and synced) by a thread of the writer's own while the next
    is built, one at a time: the write is the kernel's copy into new page-cache pages (on
    this VM a fault on the host for each: 0.8 s of an import's thread for 130 MiB, py-spy)
    and releases the interpreter, which building holds. With `direct` the tables go past
    the page cache instead (broker/direct.py), from one buffer: for a database nothing
    reads soon (an import's), whose new page-cache pages were the writer's largest cost."""

    def __init__(self, path: Path, sync: bool, direct: bool = False) -> None:
        path.mkdir(parents=True)
        self.path = path
        self._sync = sync
        self._direct = aligned_buffer() if direct else None
        # level, number, size, smallest and largest internal keys
        self._files: list[tuple[int, int, int, bytes, bytes]] = []
        self._next_number = _MANIFEST_NUMBER + 1
        self._sequence_trailer = trailer(_SEQUENCE)
        self._table = _Table(self._sequence_trailer)
        self._last: bytes | None = None
        self._files_out = ThreadPoolExecutor(1, thread_name_prefix="table-writer")
        self._writing: Future[None] | None = None  # the last table's write
        self.count = 0

    def add(self, key: bytes, value: bytes) -> bool:
        """Writes the pair, or refuses it (False): its key is not after the last one."""
        last = self._last
        if last is not None and key <= last:
            return False
        self._last = key
        table = self._table
        table.add(key, value)
        self.count += 1
        if len(table.out) >= TABLE_BYTES:
            self._end_table(LEVEL)
        return True

    def finish(self, late: Sequence[tuple[bytes, bytes]] = ()) -> None:
        """The pairs added, then `late` (later pairs of a key win, as in LevelDB), become a
        database (see the module docstring)."""
        pending = sorted(dict(late).items())
        last = self._last
        if pending and (last is None or pending[0][0] > last):
            for key, value in pending:
                self.add(key, value)
            pending = []
        self._end_table(LEVEL)
        last_sequence = _SEQUENCE
        if pending:
            self._table = _Table(trailer(_LATE_SEQUENCE))
            for key, value in pending:
                self._table.add(key, value)
            self._end_table(LATE_LEVEL)
            last_sequence = _LATE_SEQUENCE
        self.close()
        self._write_manifest(last_sequence)

    def close(self) -> None:
        """Blocking: the table being written written (an error of it raised), the thread
        gone."""
        try:
            self._written()
        finally:
            self._files_out.shutdown()

    def _written(self) -> None:
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def _end_table(self, level: int) -> None:
        table = self._table
        if not table.entries:
            return
        number = self._next_number
        self._next_number += 1
        data = table.finish()
        self._written()  # (one table at a time in memory, besides the one being built)
        self._writing = self._files_out.submit(self._write_table, f"{number:06d}.ldb", data)
        self._files.append((level, number, len(data), table.smallest + table.trailer,
                            table.largest + table.trailer))
        self._table = _Table(self._sequence_trailer)

    def _write_manifest(self, last_sequence: int) -> None:
        """MANIFEST-000001 listing the tables, then CURRENT naming it (renamed in, as
        LevelDB's SetCurrentFile does, from a temporary file its next open deletes)."""
        edit = bytearray()
        put_varint(edit, _TAG_COMPARATOR)
        _prefixed(edit, _COMPARATOR)
        for tag, number in ((_TAG_LOG_NUMBER, 0), (_TAG_NEXT_FILE, self._next_number),
                            (_TAG_LAST_SEQUENCE, last_sequence)):
            put_varint(edit, tag)
            put_varint(edit, number)
        for level, number, size, smallest, largest in self._files:
            put_varint(edit, _TAG_NEW_FILE)
            put_varint(edit, level)
            put_varint(edit, number)
            put_varint(edit, size)
            _prefixed(edit, smallest)
            _prefixed(edit, largest)
        manifest = f"MANIFEST-{_MANIFEST_NUMBER:06d}"
        self._write(manifest, log_record(bytes(edit)))
        temporary = f"{_MANIFEST_NUMBER:06d}.dbtmp"
        self._write(temporary, f"{manifest}\n".encode())
        os.replace(self.path / temporary, self.path / "CURRENT")
        if self._sync:
            fsync_dir(self.path)

    def _write_table(self, name: str, data: bytearray) -> None:
        if self._direct is None:
            self._write(name, data)
            return
        with DirectFile(self.path / name, self._sync, self._direct) as out:
            out.write(memoryview(data))

    def _write(self, name: str, data: bytes | bytearray) -> None:
        with open(self.path / name, "wb") as file:
            file.write(data)
            if self._sync:
                os.fsync(file.fileno())


def log_record(data: bytes) -> bytearray:
    """`data` as one record of a log file that starts with it (log_writer.cc)."""
    out = bytearray()
    at = 0
    offset = 0  # in the log block
    while True:
        left = _LOG_BLOCK - offset
        if left < _LOG_HEAD.size:
            out += bytes(left)
            offset = 0
        size = min(len(data) - at, _LOG_BLOCK - offset - _LOG_HEAD.size)
        first, end = at == 0, at + size == len(data)
        kind = (_FULL if end else _FIRST) if first else (_LAST if end else _MIDDLE)
        fragment = data[at:at + size]
        out += _LOG_HEAD.pack(masked(crc32c(fragment, crc32c(bytes([kind])))), size, kind)
        out += fragment
        offset += _LOG_HEAD.size + size
        at += size
        if end:
            return out
