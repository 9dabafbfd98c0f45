"""An archive checked as its bytes arrive, pushed in whatever pieces the network gives.

`archive.checked_members` reads a tar through `tarfile`, whose stream mode copies its buffer
on every read: three copies of every byte and most of the CLI's time when an export is
checked as it arrives (bench/backup_bench.py). Here each piece is parsed in place (tar
headers of 512 bytes, member data hashed through memoryview slices) and the caller writes
the same piece out: one pass, no copy. Only what `TarWriter` writes is read (ustar headers,
and a PAX header before one whose size or name does not fit); the verdicts are
`archive.Ledger`'s, the same as a file's.
"""

import hashlib
import tarfile
from concurrent.futures import Executor, Future
from typing import Final

from broker.backup.archive import BadArchive, Ledger
from broker.backup.manifest import NAME, BadManifest, Manifest, parse

_BLOCK: Final = tarfile.BLOCKSIZE
_MANIFEST_LIMIT: Final = 64 << 20
_PAX_LIMIT: Final = 1 << 20


class StreamCheck:
    """`feed` the archive's bytes in order, then `finish`: raises BadArchive at the first
    member that is not what the archive lists (or at `finish`, an archive cut short).

    With a `hasher` (an executor of one thread) members are hashed there, while the caller
    writes the piece out (hashlib lets go of the GIL): the caller changes no piece it fed
    before `settle` returns."""

    def __init__(self, hasher: Executor | None = None) -> None:
        self._hasher = hasher
        self._hashing: Future[None] | None = None
        self._ledger: Ledger | None = None
        self._head = bytearray()
        self._kept: bytearray | None = None  # kept: the manifest, checksums, a PAX header
        self._pax: dict[str, str] = {}
        self._path = ""
        self._kind = b""
        self._sha = hashlib.sha256()
        self._size = 0
        self._left = 0  # the member's data still to come
        self._skip = 0  # then its padding
        self._ended = False

    def feed(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        at, end = 0, len(view)
        while at < end and not self._ended:
            if self._left:
                take = min(self._left, end - at)
                piece = view[at:at + take]
                if self._kept is not None:
                    self._kept += piece
                elif self._hasher is None:
                    self._sha.update(piece)
                else:
                    self._hashing = self._hasher.submit(self._sha.update, piece)
                self._left -= take
                at += take
                if not self._left:
                    self._member_done()
            elif self._skip:
                take = min(self._skip, end - at)
                self._skip -= take
                at += take
            else:
                take = min(_BLOCK - len(self._head), end - at)
                self._head += view[at:at + take]
                at += take
                if len(self._head) == _BLOCK:
                    self._header(bytes(self._head))
                    self._head.clear()

    def settle(self) -> None:
        """Waits until the pieces fed are hashed."""
        if self._hashing is not None:
            self._hashing.result()
            self._hashing = None

    def finish(self) -> Manifest:
        if not self._ended:
            where = f" in {self._path}" if self._left or self._skip else ""
            raise BadArchive(f"the archive is cut short{where}: no end of archive")
        if self._ledger is None:
            raise BadArchive(f"empty archive: no {NAME}")
        return self._ledger.finish()

    def _header(self, block: bytes) -> None:
        if block.count(0) == _BLOCK:
            self._ended = True  # the end of the archive (two zero blocks: one is enough)
            return
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.TarError as error:
            raise BadArchive(f"after {self._path or 'the start'}: not a tar header: {error}"
                             ) from None
        path = self._pax.pop("path", info.name)
        size = int(self._pax.pop("size", info.size))
        self._pax.clear()
        self._path, self._kind, self._size = path, info.type, size
        self._left, self._skip = size, -size % _BLOCK
        self._kept = None
        if info.type == tarfile.XHDTYPE:
            if size > _PAX_LIMIT:
                raise BadArchive(f"{path}: a PAX header of {size} bytes")
            self._kept = bytearray()
        elif not info.isfile():
            raise BadArchive(f"{path}: not a regular file")
        elif self._ledger is None or self._ledger.is_checksums(path):
            if self._ledger is None and path != NAME:
                raise BadArchive(f"the first member is not {NAME}")
            if size > _MANIFEST_LIMIT:
                raise BadArchive(f"{path}: {size} bytes: not a {path}")
            self._kept = bytearray()
        else:
            self._ledger.begin(path)
            self._sha = hashlib.sha256()
        if not size:
            self._member_done()

    def _member_done(self) -> None:
        if self._kind == tarfile.XHDTYPE:
            assert self._kept is not None
            self._pax = _pax_records(bytes(self._kept), self._path)
        elif self._ledger is None:
            assert self._kept is not None
            raw = bytes(self._kept)
            try:
                self._ledger = Ledger(parse(raw), raw)
            except BadManifest as error:
                raise BadArchive(str(error)) from None
        elif self._kept is not None:
            self._ledger.checksums(bytes(self._kept))
        else:
            self.settle()
            self._ledger.done(self._path, self._size, self._sha.hexdigest())
        self._kept = None


def _pax_records(data: bytes, where: str) -> dict[str, str]:
    """A PAX header's `LEN KEY=VALUE\\n` records."""
    records: dict[str, str] = {}
    at = 0
    try:
        while at < len(data):
            space = data.index(b" ", at)
            length = int(data[at:space])
            key, _, value = data[space + 1:at + length - 1].partition(b"=")
            records[key.decode()] = value.decode("utf-8", "surrogateescape")
            at += length
    except ValueError:
        raise BadArchive(f"{where}: a damaged PAX header") from None
    return records
