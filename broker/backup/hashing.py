"""SHA-256 of an archive's members on a thread of its own, behind the reader that writes
them out, on the other CPU.

hashlib lets go of the GIL while it hashes, but a call needs the GIL to start and to
return, and a reader building tables from the members (bulk.Build's table writer) holds it
until the interpreter's switch interval (5 ms) takes it away. A hash per chunk, waited for
before the next chunk is read, therefore made the reader wait about as long as hashing in
line (0.3-0.5 s of a 256 MiB import's ~1 s of unpacking). Here the reader never waits for
a hash, only for room in a queue of QUEUED chunks; the hashing thread takes every chunk
waiting at once and hashes a member's run of them in one call, so the fewer turns it gets
at the GIL, the more it hashes per turn. A member's digest is a future: the caller checks
it once it is there, at the latest before it trusts what it wrote.
"""

import hashlib
import queue
import threading
from concurrent.futures import Future
from typing import Any, Final, Protocol

QUEUED: Final = 16  # chunks (1 MiB each in archive.py) read and not yet hashed, at most


class Member(Protocol):
    """A member being read from an archive (its reads check or hash it on the way)."""

    def read(self, size: int = -1, /) -> bytes: ...


# A chunk to hash into a member's hash object, or (data None) that member's end: its
# digest is set on the future.
_Item = tuple[Any, bytes | None, "Future[str] | None"]


class Hashing:
    """A member's file object that has what is read through it hashed (`Hasher`)."""

    def __init__(self, handle: Member, hasher: "Hasher") -> None:
        self._handle = handle
        self._hasher = hasher
        self._sha = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        if data:
            self._hasher.put((self._sha, data, None))
            self.size += len(data)
        return data

    def digest(self) -> "Future[str]":
        """The hex SHA-256 of what was read, once hashed."""
        done: Future[str] = Future()
        self._hasher.put((self._sha, None, done))
        return done


class Hasher:
    """The hashing thread of one archive's reading; `close` ends it (a context manager)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[_Item | None] = queue.Queue(QUEUED)
        self._thread = threading.Thread(target=self._run, name="backup-hash", daemon=True)
        self._thread.start()

    def __enter__(self) -> "Hasher":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def put(self, item: _Item) -> None:
        self._queue.put(item)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        while True:
            items = [get()]
            try:
                while True:
                    items.append(get_nowait())
            except queue.Empty:
                pass
            if not _hash(items):
                return


def _hash(items: list[_Item | None]) -> bool:
    """Hashes the items in order, each member's consecutive chunks in one call; False at
    the end (None)."""
    run: list[bytes] = []
    sha: Any = None
    for item in items:
        if run and (item is None or item[0] is not sha or item[1] is None):
            sha.update(run[0] if len(run) == 1 else b"".join(run))
            run = []
        if item is None:
            return False
        sha, data, done = item
        if data is not None:
            run.append(data)
        elif done is not None:
            done.set_result(sha.hexdigest())
    if run:
        sha.update(run[0] if len(run) == 1 else b"".join(run))
    return True
