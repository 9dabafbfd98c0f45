"""The archive as bytes: a POSIX tar written as a stream, read as a stream, each member's
SHA-256 taken as it is read and checked against what the archive lists (its checksums.json,
the last member; version 1: its manifest, the first).

Nothing here holds the archive in memory, nor a member but a part of a database read
through a snapshot (`parts`: its header, which gives its size, goes first): members go out
in chunks, and a reader gets each member as a file object it reads in chunks. `verify`
reads a whole archive and names the first member that is not what the archive lists.
"""

import struct
import tarfile
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Final, Literal, Protocol

from broker.backup.hashing import Hasher, Hashing, Member
from broker.backup.manifest import (
    CHECKSUMS,
    NAME,
    PART_BYTES,
    BadManifest,
    Manifest,
    complete,
    parse,
)

CHUNK: Final = 1 << 20
_BLOCK: Final = tarfile.BLOCKSIZE
_PAIR: Final = struct.Struct(">II")
_MANIFEST_LIMIT: Final = 64 << 20  # a manifest lists files: far below this
Sink = Callable[[bytes | memoryview], None]
Expected = tuple[int, str]  # a member's size and SHA-256 hex, as the manifest lists them


class ArchiveFile(Protocol):
    """An archive open for reading: a file, an HTTP response, or an upload arriving
    (pipe.py's reader, which is no IO[bytes]). What tarfile asks of its file object;
    it never writes to one opened for reading, but wants `write` to exist."""

    def read(self, size: int, /) -> bytes: ...
    def write(self, data: bytes, /) -> object: ...
    def tell(self) -> int: ...
    def seek(self, offset: int, /) -> object: ...
    def close(self) -> object: ...


class Opens(Protocol):
    """An archive to read from its start: a file's Path, or an upload arriving (pipe.py).
    `mode` is "rb" alone: Path.open without it opens text."""

    def open(self, mode: Literal["rb"]) -> AbstractContextManager[ArchiveFile]: ...


class BadArchive(ValueError):
    """The archive is not whole or not what its manifest says: names the member."""


# ---- pairs: a database's keys and values as one member ----------------------------------
def encode_pairs(pairs: Iterable[tuple[bytes, bytes]]) -> Iterator[bytes]:
    """`klen:u32 vlen:u32 key value`, repeated, in chunks of about CHUNK bytes."""
    parts: list[bytes] = []
    size = 0
    pack = _PAIR.pack
    for key, value in pairs:
        parts += (pack(len(key), len(value)), key, value)
        size += 8 + len(key) + len(value)
        if size >= CHUNK:
            yield b"".join(parts)
            parts, size = [], 0
    if parts:
        yield b"".join(parts)


def parts(chunks: Iterable[bytes]) -> Iterator[list[bytes]]:
    """`encode_pairs`' chunks (whole pairs each) grouped into parts of PART_BYTES or a chunk
    more, the last smaller: a member each (manifest.py). One part, empty, for no chunk."""
    part: list[bytes] = []
    size = 0
    empty = True
    for chunk in chunks:
        part.append(chunk)
        size += len(chunk)
        if size >= PART_BYTES:
            yield part
            part, size, empty = [], 0, False
    if part or empty:
        yield part


def decode_pairs(file: Member, where: str) -> Iterator[tuple[bytes, bytes]]:
    """The pairs of `encode_pairs`, the member read CHUNK at a time (two reads a pair would
    be two calls through the tar reader's layers, and a stream's copies its buffer on each;
    a read may return less). Pairs are cut from the chunk read; only a pair the chunk's end
    cuts is put together from its parts (joining the rest of a chunk to the next copied
    every byte once more)."""
    cut: list[bytes] = []  # the parts of a pair the reads so far cut
    cut_size = whole = 0  # their size; the pair's, once its head is read (0: not yet)
    while chunk := file.read(CHUNK):
        at = 0
        if cut:
            if not whole:  # (cut_size < _PAIR.size)
                head = b"".join(cut) + chunk[:_PAIR.size - cut_size]
                whole = _PAIR.size + sum(_PAIR.unpack(head)) if len(head) == _PAIR.size else 0
            if not whole or whole - cut_size > len(chunk):
                cut.append(chunk)
                cut_size += len(chunk)
                continue
            at = whole - cut_size
            pair = b"".join([*cut, chunk[:at]])
            cut, cut_size, whole = [], 0, 0
            key_end = _PAIR.size + _PAIR.unpack_from(pair)[0]
            yield pair[_PAIR.size:key_end], pair[key_end:]
        size = len(chunk)
        while size - at >= _PAIR.size:
            klen, vlen = _PAIR.unpack_from(chunk, at)
            end = at + _PAIR.size + klen + vlen
            if end > size:
                whole = end - at
                break
            key_end = at + _PAIR.size + klen
            yield chunk[at + _PAIR.size:key_end], chunk[key_end:end]
            at = end
        if at < size:
            cut, cut_size = [chunk[at:]], size - at
    if cut_size < _PAIR.size and cut_size:
        raise BadArchive(f"{where}: cut short in a pair's head")
    if cut_size:
        raise BadArchive(f"{where}: cut short in a pair")


# ---- writing ------------------------------------------------------------------------------
class TarWriter:
    """Members out to `sink` as they come; with `gzip`, the stream gzip-compressed (a
    `.tar.gz` file)."""

    def __init__(self, sink: Sink, gzip: bool = False) -> None:
        self._compress = zlib.compressobj(6, zlib.DEFLATED, 31) if gzip else None
        self._sink = sink
        self._mtime = int(time.time())
        self.bytes = 0

    def _out(self, data: bytes | memoryview) -> None:
        if self._compress is not None:
            data = self._compress.compress(data)
            if not data:
                return
        self.bytes += len(data)
        self._sink(data)

    def _header(self, path: str, size: int) -> bytes:
        info = tarfile.TarInfo(path)
        info.size, info.mtime, info.mode = size, self._mtime, 0o644
        return info.tobuf(tarfile.PAX_FORMAT)

    def add(self, path: str, size: int, chunks: Iterable[bytes | memoryview]) -> None:
        """A member of `size` bytes; raises BadArchive if the chunks add up otherwise (the
        source changed since its checksum was taken)."""
        self._out(self._header(path, size))
        written = 0
        for chunk in chunks:
            written += len(chunk)
            if written > size:
                break
            self._out(chunk)
        self._end(path, size, written)

    def add_sent(self, path: str, size: int, sent: Iterable[int]) -> None:
        """A member whose bytes the caller sends to the sink itself (a file by `sendfile`),
        `sent` sending them and yielding each piece's length: its header and padding go
        from here, around them. Not for a compressed stream."""
        if self._compress is not None:
            raise ValueError("a compressed archive's members go through its compressor")
        self._out(self._header(path, size))
        written = 0
        for piece in sent:
            written += piece
            self.bytes += piece
        self._end(path, size, written)

    def _end(self, path: str, size: int, written: int) -> None:
        if written != size:
            raise BadArchive(f"{path}: {written} bytes read, {size} expected (it changed"
                             f" during the export)")
        if size % _BLOCK:
            self._out(bytes(_BLOCK - size % _BLOCK))

    def close(self) -> None:
        self._out(bytes(2 * _BLOCK))
        if self._compress is not None:
            tail = self._compress.flush()
            self.bytes += len(tail)
            self._sink(tail)


# ---- reading ------------------------------------------------------------------------------
def _chunks(file: Member) -> Iterator[bytes]:
    while chunk := file.read(CHUNK):
        yield chunk


_DAMAGED: Final = (tarfile.TarError, EOFError, zlib.error, OSError)


class _Member:
    """A member's file object whose read errors (the archive cut short or damaged in it)
    are BadArchive naming it."""

    def __init__(self, handle: Member, name: str) -> None:
        self._handle = handle
        self._name = name

    def read(self, size: int = -1) -> bytes:
        try:
            return self._handle.read(size)
        except _DAMAGED as error:
            raise BadArchive(f"{self._name}: the archive is damaged or cut short here:"
                             f" {error}") from None


class _Span:
    """A member's data read from the archive's file object itself, each read a read of it
    (`read1` where it has one: an upload arriving hands over its pieces as they came,
    pipe.py), up to what is left of the member. tarfile's own reader copies every byte
    once more (its buffered reader's result, filled from what the file returned)."""

    def __init__(self, file: ArchiveFile, offset: int, size: int) -> None:
        self._file = file
        self._read = getattr(file, "read1", file.read)
        self._at, self._left = offset, size

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        size = min(size, self._left)
        if size <= 0:
            return b""
        if self._file.tell() != self._at:
            self._file.seek(self._at)
        data = self._read(size)
        if not data:
            raise EOFError("unexpected end of data")
        self._at += len(data)
        self._left -= len(data)
        return data


def _members(file: ArchiveFile) -> Iterator[tuple[str, int, Member]]:
    """Each member as a stream (gzip or not): (path, size, its file object, to read before
    the next). Members are not checked here.

    A file on disk, or an upload arriving, is read as one (`r:`: a member's reads are reads
    of the file, `_Span`), a stream (an HTTP response) as a stream (`r|`: tarfile copies
    what its buffer holds on every read, cheap only for reads of CHUNK, which is all a
    stream's reader does)."""
    seekable = getattr(file, "seekable", None)
    mode: Literal["r:*", "r|*"] = "r:*" if seekable is not None and seekable() else "r|*"
    try:
        with tarfile.open(fileobj=file, mode=mode, bufsize=CHUNK) as tar:
            while (info := tar.next()) is not None:
                if not info.isfile():
                    raise BadArchive(f"{info.name}: not a regular file")
                handle: Member | None
                if mode == "r:*" and info.sparse is None:
                    handle = _Span(tar.fileobj, info.offset_data, info.size)
                else:
                    handle = tar.extractfile(info)
                assert handle is not None
                yield info.name, info.size, _Member(handle, info.name)
    except _DAMAGED as error:
        raise BadArchive(f"not a tar archive, or damaged or cut short: {error}") from None


def _whole(path: str, size: int, handle: Member) -> bytes:
    """The manifest or checksums.json, read whole."""
    if size > _MANIFEST_LIMIT:
        raise BadArchive(f"{path}: {size} bytes: not a {path}")
    return handle.read()


def _head(path: str, raw: bytes) -> Manifest:
    if path != NAME:
        raise BadArchive(f"the first member is not {NAME}")
    try:
        return parse(raw)
    except BadManifest as error:
        raise BadArchive(str(error)) from None


def check_member(path: str, size: int, sha256: str, want: Expected, lister: str = NAME,
                 ) -> None:
    """Raises BadArchive unless a member read whole is of the size and SHA-256 `lister`
    lists."""
    if size != want[0]:
        raise BadArchive(f"{path}: {size} bytes, {lister} says {want[0]}")
    if sha256 != want[1]:
        raise BadArchive(f"{path}: checksum mismatch: sha256 {sha256}, {lister} says"
                         f" {want[1]}")


def unlisted(path: str) -> BadArchive:
    return BadArchive(f"{path}: not listed in {NAME} (or listed once and found twice)")


def missing(expected: dict[str, Expected]) -> BadArchive:
    """The archive ended with these members listed and not found."""
    return BadArchive(f"{min(expected)}: listed in {NAME} but not in the archive (cut"
                      f" short?)")


class Ledger:
    """An archive's members as read, against what it lists (version 2: its checksums.json,
    the last member; version 1: its manifest, the first): the verdicts of `checked_members`
    and StreamCheck alike, naming the first member, in the archive's order, that is not of
    its listed size and SHA-256, not listed, or listed and missing."""

    def __init__(self, manifest: Manifest, raw: bytes) -> None:
        self.manifest = manifest
        self._raw = raw
        self._expected: dict[str, Expected] | None = (
            _listed(manifest) if manifest.version == 1 else None)
        self._found: dict[str, Expected] = {}  # version 2: until checksums.json
        self._begun: set[str] = set()  # members whose verdict may still be to come
        self._ended = False  # version 2: checksums.json was read

    def is_checksums(self, path: str) -> bool:
        """Whether the member is the archive's checksums.json (to read whole)."""
        return path == CHECKSUMS and self._expected is None

    def begin(self, path: str) -> None:
        """A member's header; raises BadArchive if it cannot be one of this archive."""
        if self._ended:
            raise BadArchive(f"{path}: after {CHECKSUMS}, which ends an archive")
        if path in self._begun or (self._expected is not None and path not in self._expected):
            raise unlisted(path)
        self._begun.add(path)

    def done(self, path: str, size: int, sha256: str) -> None:
        """The member read whole: its size and SHA-256."""
        if self._expected is not None:
            check_member(path, size, sha256, self._expected.pop(path))
        else:
            self._found[path] = (size, sha256)

    def checksums(self, raw: bytes) -> Manifest:
        """checksums.json, read: the manifest with its files; every member found checked."""
        if self._ended:
            raise BadArchive(f"{CHECKSUMS} twice")
        try:
            self.manifest = complete(self.manifest, self._raw, raw)
        except BadManifest as error:
            raise BadArchive(str(error)) from None
        self._ended = True
        expected = _listed(self.manifest)
        for path, (size, sha256) in self._found.items():
            want = expected.pop(path, None)
            if want is None:
                raise unlisted(path)
            check_member(path, size, sha256, want, CHECKSUMS)
        if expected:
            raise missing(expected)
        return self.manifest

    def finish(self) -> Manifest:
        """The archive ended: raises BadArchive if it lacks a member (or its checksums)."""
        if self._expected is None and not self._ended:
            raise BadArchive(f"no {CHECKSUMS} at the end: the archive is cut short")
        if self._expected:
            raise missing(self._expected)
        return self.manifest


def _listed(manifest: Manifest) -> dict[str, Expected]:
    return {m.path: (m.size, m.sha256) for m in manifest.files}


def checked_members(file: ArchiveFile) -> Iterator[tuple[Manifest, str, Member | None]]:
    """The archive's members as (manifest, path, file object to read before the next): the
    manifest and checksums.json (version 2) with None, each read whole here (the manifest
    given with checksums.json has its files). Each member is hashed as it is read (what the
    caller did not read is read to the end), and checked (Ledger): a caller that writes
    members out keeps what it wrote only once the iteration ends without an error."""
    with Hasher() as hasher:
        yield from _checked(file, hasher)


def _checked(file: ArchiveFile, hasher: Hasher,
             ) -> Iterator[tuple[Manifest, str, Member | None]]:
    ledger: Ledger | None = None
    hashed: deque[tuple[str, int, Future[str]]] = deque()  # members read, in order
    for path, size, handle in _members(file):
        if ledger is None:
            raw = _whole(path, size, handle) if path == NAME else b""
            ledger = Ledger(_head(path, raw), raw)
            yield ledger.manifest, path, None
            continue
        if ledger.is_checksums(path):
            _settle(ledger, hashed, wait=True)
            yield ledger.checksums(_whole(path, size, handle)), path, None
            continue
        ledger.begin(path)
        hashing = Hashing(handle, hasher)
        yield ledger.manifest, path, hashing
        while hashing.read(CHUNK):
            pass
        hashed.append((path, hashing.size, hashing.digest()))
        _settle(ledger, hashed, wait=False)
    if ledger is None:
        raise BadArchive(f"empty archive: no {NAME}")
    _settle(ledger, hashed, wait=True)
    ledger.finish()


def _settle(ledger: "Ledger", hashed: deque[tuple[str, int, Future[str]]], wait: bool,
            ) -> None:
    """The members whose hashes are done checked, in the archive's order (with `wait`,
    all of them): a member's verdict may come after later members were read, never after
    the iteration ends."""
    while hashed and (wait or hashed[0][2].done()):
        path, size, digest = hashed.popleft()
        ledger.done(path, size, digest.result())


def verify(file: ArchiveFile) -> Manifest:
    """Reads the whole archive, checking every member (`checked_members`)."""
    manifest = None
    for found, _, _ in checked_members(file):
        manifest = found
    assert manifest is not None
    return manifest


def read_manifest(file: ArchiveFile) -> Manifest:
    """The manifest alone (the first member): what an archive holds, unchecked (version 2:
    without its files, which its checksums.json, the last member, lists)."""
    for path, size, handle in _members(file):
        return _head(path, _whole(path, size, handle) if path == NAME else b"")
    raise BadArchive(f"empty archive: no {NAME}")


def copy_chunks(file: Member) -> Iterator[bytes]:
    """A member's content in chunks (for a caller writing it to a file)."""
    return _chunks(file)
