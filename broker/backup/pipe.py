"""An archive arriving over HTTP, read by the import's thread as it arrives (issue 39): the
upload is no longer written to a file and read back before it is unpacked.

The event loop `put`s the body's pieces, or a thread reading the socket `give`s them
(upload.py), either waiting while LIMIT bytes are unread: the socket's backpressure reaches
the client; the import's thread `open`s it as a file: reads block until the
bytes they ask for are there (or the body ended), as a file's do, so `tarfile` reads it as
one, whose seeks (forward only, to where it reads next) skip. An import reads an archive
twice: its manifest (restore.check), then all of it; the first opening's bytes are kept
and the second begins with them, after which nothing is kept. A member's data is read with
`read1`, a piece (or what is left of one) at a time, as the loop received it: joining the
pieces into the sizes the reader asks for was a copy of every byte.
"""

import asyncio
import io
import threading
from collections import deque
from typing import Final

LIMIT: Final = 8 << 20


class Pipe:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pieces: deque[bytes] = deque()
        self._at = 0  # in the first piece: what was taken of it
        self._unread = 0
        self._waiting = False  # a put waits for room
        self._ended = False
        self._closed = False  # the reader is gone: what comes is dropped
        self._ready = threading.Condition()
        self._room = asyncio.Event()
        self._kept: bytearray | None = bytearray()  # the first opening's reads
        self._opened = 0

    # ---- the event loop's side --------------------------------------------------------
    async def put(self, piece: bytes) -> None:
        if not self._add(piece):
            return
        while True:
            with self._ready:
                if self._unread < LIMIT or self._closed:
                    return
                self._room.clear()
                self._waiting = True
            await self._room.wait()

    # ---- the socket's thread's side (upload.py) ---------------------------------------
    def give(self, piece: bytes) -> None:
        """Blocking `put`: returns once fewer than LIMIT bytes are unread (or the reader is
        gone)."""
        with self._ready:
            if not self._add(piece):
                return
            while self._unread >= LIMIT and not self._closed:
                self._ready.wait()

    def _add(self, piece: bytes) -> bool:
        """`piece` queued for the reader; False: the reader is gone (it is dropped)."""
        with self._ready:  # (reentrant: `give` holds it)
            if self._closed:
                return False
            self._pieces.append(piece)
            self._unread += len(piece)
            self._ready.notify_all()
            return True

    def end(self) -> None:
        """The body ended (or the import stopped): reads past what came return b""."""
        with self._ready:
            self._ended = True
            self._ready.notify_all()

    def close(self) -> None:
        """The reader is done: the rest of the body is dropped as it comes."""
        with self._ready:
            self._closed = True
            self._pieces.clear()
            self._at = self._unread = 0
            self._ready.notify_all()  # (a `give` waiting for room)
        self._room.set()

    # ---- the thread's side ------------------------------------------------------------
    def take(self, size: int, keep: bool, partial: bool = False) -> bytes:
        """Blocking: `size` bytes, fewer only at the end; `keep`: for the second opening.
        `partial`: what the first piece holds, up to `size` (a member's data, read as it
        came: no join of pieces)."""
        parts: list[bytes] = []
        with self._ready:
            while size > 0 and not (partial and parts):
                while not self._pieces and not self._ended:
                    self._ready.wait()
                if not self._pieces:
                    break
                piece, at = self._pieces[0], self._at
                if len(piece) - at > size:  # a part of it: copied, the rest left where it is
                    parts.append(piece[at:at + size])
                    self._at += size
                else:
                    parts.append(piece[at:] if at else piece)
                    self._pieces.popleft()
                    self._at = 0
                size -= len(parts[-1])
                self._unread -= len(parts[-1])
            if self._unread < LIMIT:
                self._ready.notify_all()  # (a `give` waiting for room)
                if self._waiting:
                    self._waiting = False
                    self._loop.call_soon_threadsafe(self._room.set)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if keep and self._kept is not None:
            self._kept += data
        return data

    def peek(self, size: int) -> bytes:
        """Blocking, before anything is taken: the body's first `size` bytes (fewer if it is
        shorter), left in the pipe."""
        with self._ready:
            while sum(map(len, self._pieces)) < size and not self._ended:
                self._ready.wait()
            head = b""
            for piece in self._pieces:
                head += piece[:size - len(head)]
                if len(head) == size:
                    break
            return head

    def open(self, mode: str = "rb") -> "_Reader":
        """The archive from its start, as a file: twice at most (see the module docstring)."""
        if mode != "rb" or self._opened >= 2:
            raise OSError("an uploaded archive is read twice at most, as bytes")
        self._opened += 1
        if self._opened == 1:
            assert self._kept is not None
            return _Reader(self, self._kept, keep=True)  # its replay grows as it reads
        kept, self._kept = bytes(self._kept or b""), None
        return _Reader(self, kept, keep=False)


class _Reader(io.RawIOBase):
    """Reads what `replay` holds, then the pipe; seeks back only within `replay` (tarfile
    tries the compressed formats first, each reading a few bytes)."""

    def __init__(self, pipe: Pipe, replay: bytes | bytearray, keep: bool) -> None:
        super().__init__()
        self._pipe, self._replay, self._keep = pipe, replay, keep
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            raise OSError("an uploaded archive is read in pieces")
        data = b""
        if self._at < len(self._replay):
            data = bytes(self._replay[self._at:self._at + size])
        if len(data) < size:
            more = self._pipe.take(size - len(data), self._keep)
            data = data + more if data else more
        self._at += len(data)
        return data

    def read1(self, size: int = -1) -> bytes:
        """Up to `size` bytes, as they came (a member's data: archive.py reads it so)."""
        if size is None or size < 0 or self._at < len(self._replay):
            return self.read(size)
        data = self._pipe.take(size, self._keep, partial=True)
        self._at += len(data)
        return data

    def readinto(self, buffer: "memoryview | bytearray") -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else self._at + offset
        if whence not in (io.SEEK_SET, io.SEEK_CUR) or target < 0 or (
                target < self._at and self._at > len(self._replay)):
            raise OSError("an uploaded archive is read forward only")
        if target < self._at:
            self._at = target
            return target
        while self._at < target:
            if not self.read(min(target - self._at, 1 << 20)):
                break
        return self._at
