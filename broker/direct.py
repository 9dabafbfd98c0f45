"""A large file written past the page cache (O_DIRECT), for the archive an export writes and
the sealed tables an import writes back.

Neither is read again soon by the process that writes it, and copying it through the page
cache was most of the cost: in the CLI's export, 0.73 of its 1.29 CPU-seconds went to the
kernel copying the archive into page-cache pages (perf; on a VM that gives freed memory back
to its host every page of a new file is also a fault there), pages that then push the
node's own data out of the cache. With O_DIRECT the device reads the data from this
module's aligned buffer. Where the file system refuses O_DIRECT (tmpfs), or for the tail
that does not fill a block, the file is written the ordinary way. `close` syncs the file
(unless made with `sync=False`): what it wrote is on the device once it returns.

The buffer is private memory (a shared mapping is shmem: its first touch of each page costs
more), and a caller writing many files one after another passes one (`aligned_buffer`) to each:
an import's sealed generations are tens of files, and a fresh 4 MiB buffer for each was a
page fault for every 4 KiB of them (perf: a tenth of the import thread's samples).
"""

import errno
import fcntl
import mmap
import os
from pathlib import Path
from types import TracebackType
from typing import Final

BUFFER: Final = 4 << 20  # a write's size: large enough for the device, a multiple of any block
_BLOCK: Final = 4096  # O_DIRECT writes whole blocks of the device: 512 or 4096 bytes
_DIRECT: Final = getattr(os, "O_DIRECT", 0)


def aligned_buffer(size: int = BUFFER) -> mmap.mmap:
    """A page-aligned buffer (as O_DIRECT wants) for `DirectFile`s written one at a time."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class DirectFile:
    """Written in order, with `write` (a copy into the buffer) or by filling `space()` and
    calling `commit` (a reader's `readinto`: no copy), then `close`d (or, on an error, left
    by the `with` block unsynced, for the caller to remove)."""

    def __init__(self, path: Path, sync: bool = True, buffer: int | mmap.mmap = BUFFER,
                 ) -> None:
        """`buffer`: its size, or one to use (`aligned_buffer`: no other file may use it until
        this one is closed)."""
        self._sync = sync
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            self._fd = os.open(path, flags | _DIRECT, 0o644)
            self.direct = bool(_DIRECT)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            self._fd = os.open(path, flags, 0o644)
            self.direct = False
        self._view = memoryview(aligned_buffer(buffer) if isinstance(buffer, int) else buffer)
        self._fill = 0
        self.bytes = 0

    def space(self) -> memoryview:
        """The buffer's free part, to fill from its start and `commit`."""
        return self._view[self._fill:]

    def commit(self, size: int) -> None:
        """`size` bytes of `space()` are filled: written out once the buffer is full."""
        self._fill += size
        self.bytes += size
        if self._fill == len(self._view):
            self._write(self._view)
            self._fill = 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        at = 0
        while at < len(view):
            space = self.space()
            take = min(len(space), len(view) - at)
            space[:take] = view[at:at + take]
            self.commit(take)
            at += take
        return len(view)

    def flush(self) -> None:
        """Nothing to do before `close` (a file object's method, which gzip calls): the
        buffer goes out when full, and what is left at close."""

    def _write(self, data: memoryview) -> None:
        while data:
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        """The rest written, its whole blocks past the page cache too (an import's sealed
        tables, about 2 MiB each, never fill the buffer: through the page cache, each of
        their pages was a new one, a fault on this VM's host, a seventh of the node's CPU
        in an import), then the last partial block through the page cache (O_DIRECT writes
        whole blocks only); the file synced (`sync`) and closed (once: again does nothing)."""
        if self._fd < 0:
            return
        try:
            whole = self._fill - self._fill % _BLOCK if self.direct else 0
            if whole:
                self._write(self._view[:whole])
                self._view[:self._fill - whole] = self._view[whole:self._fill]
                self._fill -= whole
            if self._fill:
                if self.direct:
                    fcntl.fcntl(self._fd, fcntl.F_SETFL,
                                fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~_DIRECT)
                self._write(self._view[:self._fill])
                self._fill = 0
            if self._sync:
                os.fsync(self._fd)
        finally:
            self._release()

    def _release(self) -> None:
        """The file closed; the buffer goes with the last view of it (a reader's or the
        hasher's may outlive this)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "DirectFile":
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self._release()
