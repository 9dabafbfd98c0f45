"""A Raft state machine's snapshots through files on both nodes, dumped on a worker thread.

A snapshot can be as large as the machine's database: a `messages` shard holds up to
`generation_max_size` per generation, the `sessions` database hundreds of MiB for a million
durable sessions. Held in memory it would take more than a node may hold; read on the event
loop it would hold the loop for seconds, long enough for every group the node leads to lose
it. So:

- The sender dumps the snapshot into a file beside the database (`<dir>.snapshot-out`) on a
  worker thread, and reads each chunk asked for from that file. What the thread reads is
  fixed on the loop when the dump starts (the machine's `start_dump`: a LevelDB snapshot,
  say); until the file is complete `chunk` answers None, and `on_dumped` then has the core
  ask again. A dump under way is ended (`end_dump`) before anything closes what it reads.
- One spooled snapshot serves every transfer that asks for one (a follower that starts over,
  another one catching up) until its last chunk is sent or it lies unread for `idle`
  seconds; meanwhile `kept` names its index, and the machine keeps the log from being
  compacted past it, so it stays one the leader can send.
- The receiver appends chunks to `<dir>.snapshot-in` and hands the machine the complete file.

A crash leaves at most these two files, removed when the spool is made at the next start.
"""

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Final

from broker.raft.ready import SnapshotChunk

log = logging.getLogger(__name__)

CHUNK_BYTES: Final = 256 << 10
IDLE_SECONDS: Final = 30.0
FILE_BUFFER: Final = 1 << 20  # of the snapshot files, written and read

# Writes a snapshot into the file, on a worker thread; ends soon (DumpStopped) once the event
# is set.
DumpWriter = Callable[[IO[bytes], threading.Event], None]
# On the loop: fixes what a dump reads; returns what writes it (on the worker thread) and
# what releases what was fixed.
StartDump = Callable[[], tuple[DumpWriter, Callable[[], None]]]


class DumpStopped(Exception):
    pass


class _Dump:
    """A dump under way: its thread's job, and what releases what the loop fixed for it."""

    __slots__ = ("done", "index", "job", "release", "stop")

    def __init__(self, index: int, job: "concurrent.futures.Future[int]",
                 stop: threading.Event, release: Callable[[], None],
                 done: "asyncio.Future[None]") -> None:
        self.index = index
        self.job = job
        self.stop = stop
        self.release = release
        self.done = done


def _write_dump(path: Path, write: DumpWriter, stop: threading.Event) -> int:
    """On a worker thread: the snapshot into `path`; returns its size."""
    with path.open("wb", buffering=FILE_BUFFER) as file:
        write(file, stop)
        return file.tell()


class SnapshotSpool:
    """The snapshot files of the machine whose database is `directory` (`name` in logs).
    `executor` runs the dumps; `start_dump` starts one of the applied state."""

    def __init__(self, directory: Path, name: str,
                 executor: Callable[[], concurrent.futures.Executor],
                 start_dump: StartDump) -> None:
        self.name = name
        self._executor = executor
        self._start_dump = start_dump
        self._outgoing_path = directory.with_name(directory.name + ".snapshot-out")
        self._incoming_path = directory.with_name(directory.name + ".snapshot-in")
        for leftover in (self._outgoing_path, self._incoming_path):
            leftover.unlink(missing_ok=True)
        self._outgoing: tuple[int, int] | None = None  # the spooled one's index and size
        self._used = 0.0  # when a chunk of it was last read (monotonic)
        self.idle = IDLE_SECONDS
        self._dumping: _Dump | None = None
        self._refuse_dumps = False
        # The last dump started: done once its file is complete, or it failed or stopped.
        self.dumped: asyncio.Future[None] | None = None
        self.on_dumped: Callable[[], None] | None = None  # a dump's file is complete

    def chunk(self, applied: int, index: int, offset: int) -> tuple[int, bytes, bool] | None:
        """The machine's `snapshot_chunk`, `applied` its applied index."""
        outgoing = self._outgoing
        if outgoing is None:
            self._dump(applied)
            return None
        if index not in (0, outgoing[0]):
            return None  # one no longer kept: the core starts over, and gets the one spooled
        at, size = outgoing
        with self._outgoing_path.open("rb") as file:
            file.seek(offset)
            data = file.read(CHUNK_BYTES)
        done = offset + len(data) >= size
        self._used = time.monotonic()
        if done:
            self.drop()
        return at, data, done

    def receive(self, chunk: SnapshotChunk, install: Callable[[Path], None]) -> bool:
        """Appends a received chunk; with the last one, `install(the complete file)`, and
        True. The core hands chunks over in order, from offset 0 (core.py `_on_snapshot`).
        A dump under way and a spooled snapshot end first: they are of the state being
        replaced, and the install closes what a dump reads."""
        path = self._incoming_path
        try:
            with path.open("wb" if chunk.offset == 0 else "ab") as file:
                file.write(chunk.data)
        except OSError:
            path.unlink(missing_ok=True)  # the transfer starts over: what came is no use
            raise
        if not chunk.done:
            return False
        self.end_dump()
        self.drop()
        try:
            install(path)
        finally:
            path.unlink()
        return True

    def kept(self) -> list[int]:
        """The indexes of the snapshots being sent or prepared: the log keeps what follows."""
        kept = [] if self._outgoing is None else [self._outgoing[0]]
        return kept if self._dumping is None else [*kept, self._dumping.index]

    def drop_idle(self) -> None:
        """Removes a spooled snapshot no transfer read for `idle` seconds: its transfers
        were given up (a follower that asks again gets a new one)."""
        if self._outgoing is not None and time.monotonic() - self._used > self.idle:
            self.drop()

    def drop(self) -> None:
        self._outgoing = None
        self._outgoing_path.unlink(missing_ok=True)

    def end_dump(self, for_good: bool = False) -> None:
        """Blocking: stops a dump under way (its thread ends soon), before what it reads is
        closed under it; `for_good`: none starts any more (the node is stopping)."""
        self._refuse_dumps = self._refuse_dumps or for_good
        dump = self._dumping
        if dump is None:
            return
        dump.stop.set()
        concurrent.futures.wait([dump.job])
        self._dumped(dump)

    def _dump(self, applied: int) -> None:
        if self._dumping is not None or self._refuse_dumps:
            return
        write, release = self._start_dump()
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        try:
            job = self._executor().submit(_write_dump, self._outgoing_path, write, stop)
        except BaseException:
            release()
            raise
        dump = self._dumping = _Dump(applied, job, stop, release, loop.create_future())
        self.dumped = dump.done
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._dumped, dump))

    def _dumped(self, dump: _Dump) -> None:
        """On the loop, once the dump's thread ended (or at once, by `end_dump`)."""
        if self._dumping is not dump:
            return  # ended already
        self._dumping = None
        dump.release()
        job = dump.job
        if job.cancelled() or job.exception() is not None:
            if not dump.stop.is_set():
                log.warning("snapshot of %s at index %d failed: %r", self.name, dump.index,
                            job.exception())
            self._outgoing_path.unlink(missing_ok=True)
        else:
            self._outgoing = (dump.index, job.result())
            self._used = time.monotonic()
            if self.on_dumped is not None:
                self.on_dumped()
        dump.done.set_result(None)
