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
- A dump may name files to send as they are rather than copy them into the spool (sealed
  generations: broker/ds/shipped.py): each an `Insert` at a point of the spool file, hard-
  linked on the thread into `<dir>.snapshot-links` so nothing removes it meanwhile. The
  snapshot sent is then the spool file with each such file's bytes, and their CRC-32 (4
  bytes, big-endian), spliced in at its point: the file is read chunk by chunk at its
  link, never copied on the sender. A dump that names them before it writes the rest (its
  `splice`) has the stream up to their end leave meanwhile: the files do not wait for
  the records dumped after them.
- Chunks leave at most at the node's `Pace` (`durable_storage.raft.snapshot_bytes_rate`,
  all groups together): past it `chunk` answers None and `on_dumped` has the core ask again
  once the rate allows, so a replica catching up never takes the links from client traffic.
  A slow pace makes the chunks shorter, so the transfer still moves within the core's
  timeout.

A crash leaves at most these files, removed when the spool is made at the next start.
"""

import asyncio
import bisect
import concurrent.futures
import logging
import shutil
import struct
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Final, NamedTuple

from broker.raft.ready import SnapshotChunk

log = logging.getLogger(__name__)

# 1 MiB, up to four in flight (progress.py's SNAPSHOT_WINDOW): at 1 Gbit/s a chunk holds the
# link for 8 ms, against 64 MiB frames allowed.
CHUNK_BYTES: Final = 1 << 20
# At a low pace a chunk holds back the next one for as long as it takes at the rate, and
# the Raft core gives up a transfer that does not move for an election timeout (1 s by
# default): paced chunks are what leaves in PACED_SECONDS, at least MIN_CHUNK_BYTES.
PACED_SECONDS: Final = 0.25
MIN_CHUNK_BYTES: Final = 64 << 10
IDLE_SECONDS: Final = 30.0
FILE_BUFFER: Final = 1 << 20  # of the snapshot files, written and read
CRC: Final = struct.Struct(">I")


class Insert(NamedTuple):
    """A file whose bytes, then their CRC-32, are sent at `at` of the spool file."""

    at: int
    path: Path
    size: int


# Called by a dump's writer, on its thread, with the files it splices in, once the spool
# file holds everything up to their point: the stream up to their end may leave meanwhile.
Splice = Callable[[list[Insert]], None]
# Writes a snapshot into the file, on a worker thread; ends soon (DumpStopped) once the event
# is set. Returns the files to splice into it (None: none), the ones it gave `splice` if any.
DumpWriter = Callable[[IO[bytes], threading.Event, Splice], list[Insert] | None]
# On the loop: fixes what a dump reads; returns what writes it (on the worker thread) and
# what releases what was fixed.
StartDump = Callable[[], tuple[DumpWriter, Callable[[], None]]]


class DumpStopped(Exception):
    pass


class _Dump:
    """A dump under way: its thread's job, what releases what the loop fixed for it, and
    the stream its splice made (sent before the dump ends)."""

    __slots__ = ("done", "index", "job", "release", "stop", "stream")

    def __init__(self, index: int, stop: threading.Event, release: Callable[[], None],
                 done: "asyncio.Future[None]") -> None:
        self.index = index
        self.job: concurrent.futures.Future[tuple[_Stream, int]] | None = None
        self.stop = stop
        self.release = release
        self.done = done
        self.stream: _Stream | None = None


def _write_dump(path: Path, write: DumpWriter, stop: threading.Event,
                spliced: Callable[["_Stream"], None]) -> "tuple[_Stream, int]":
    """On a worker thread: the snapshot into `path`; returns how it is sent (the stream
    given to `spliced` if the writer spliced files in early) and the file's size."""
    early: list[_Stream] = []

    def splice(inserts: list[Insert]) -> None:
        file.flush()  # what the stream reads of the spool file before the files' end
        early.append(_Stream(path, inserts))
        spliced(early[0])

    with path.open("wb", buffering=FILE_BUFFER) as file:
        inserts = write(file, stop, splice) or []
        size = file.tell()
    return (early[0] if early else _Stream(path, inserts)), size


class Pace:
    """The node's byte rate for snapshot chunks, shared by its groups (a token bucket
    holding at most `burst` bytes; None: no limit)."""

    def __init__(self, rate: tuple[float, float] | None, burst: int = 4 * CHUNK_BYTES) -> None:
        self.rate = None if rate is None else rate[0] / rate[1]
        self.burst = float(burst)
        self._tokens = self.burst
        self._stamp = time.monotonic()

    def wait(self) -> float:
        """Seconds until a chunk may leave (0.0: now)."""
        if self.rate is None:
            return 0.0
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def spend(self, size: int) -> None:
        if self.rate is not None:
            self._tokens -= size

    def chunk_bytes(self) -> int:
        """The size of a chunk at this pace: CHUNK_BYTES, less at a rate that would hold the
        next one back past PACED_SECONDS (1 MiB at 1MB/s: 1.05 s)."""
        if self.rate is None:
            return CHUNK_BYTES
        return max(MIN_CHUNK_BYTES, min(CHUNK_BYTES, int(self.rate * PACED_SECONDS)))


class _Stream:
    """A spooled snapshot as sent: the spool file with the inserted files spliced in.
    `starts[i]` is where part i begins in the stream; a part is a slice of the spool file
    (kind 0, its offset there), a file (kind 1) or a file's CRC (kind 2). Until `finish`
    gives the spool file's size, the stream ends after the last file's CRC (the dump is
    still writing what follows)."""

    def __init__(self, spool: Path, inserts: list[Insert]) -> None:
        self.spool = spool
        self.files = [insert.path for insert in inserts]
        self.parts: list[tuple[int, int, int, int]] = []  # kind, ref, offset in it, length
        position = 0
        for number, insert in enumerate(inserts):
            self.parts.append((0, 0, position, insert.at - position))
            self.parts.append((1, number, 0, insert.size))
            self.parts.append((2, number, 0, CRC.size))
            position = insert.at
        self._tail = position  # where the rest of the spool file starts
        self.starts: list[int] = []
        total = 0
        for part in self.parts:
            self.starts.append(total)
            total += part[3]
        self.size = total
        self.complete = False
        self._crc: dict[int, tuple[int, int]] = {}  # file -> (bytes summed, CRC of them)

    def finish(self, spool_size: int) -> None:
        """The dump is over: the rest of the spool file ends the stream."""
        if not self.complete:
            self.parts.append((0, 0, self._tail, spool_size - self._tail))
            self.starts.append(self.size)
            self.size += spool_size - self._tail
            self.complete = True

    def read(self, offset: int, limit: int) -> bytes:
        out: list[bytes] = []
        wanted = limit
        i = bisect.bisect_right(self.starts, offset) - 1
        while wanted > 0 and i < len(self.parts):
            kind, ref, base, length = self.parts[i]
            inner = offset - self.starts[i]
            take = min(wanted, length - inner)
            if take > 0:
                data = self._part(kind, ref, base + inner, take)
                out.append(data)
                wanted -= len(data)
                offset += len(data)
            i += 1
        return b"".join(out)

    def _part(self, kind: int, ref: int, at: int, size: int) -> bytes:
        if kind == 2:
            return CRC.pack(self._crc_upto(ref, self.parts[3 * ref + 1][3]))
        path = self.spool if kind == 0 else self.files[ref]
        with path.open("rb") as file:
            file.seek(at)
            data = file.read(size)
        if len(data) != size:
            raise OSError(f"{path}: {len(data)} bytes at {at} where {size} were expected")
        if kind == 1:
            self._crc[ref] = (at + size, zlib.crc32(data, self._crc_upto(ref, at)))
        return data

    def _crc_upto(self, ref: int, end: int) -> int:
        """The CRC of file `ref`'s first `end` bytes: kept as chunks go by, read again
        only when a transfer resumes elsewhere (another follower, a restart)."""
        done, crc = self._crc.get(ref, (0, 0))
        if done != end:
            crc = 0
            with self.files[ref].open("rb") as file:
                remaining = end
                while remaining:
                    data = file.read(min(remaining, FILE_BUFFER))
                    if not data:
                        raise OSError(f"{self.files[ref]}: shorter than {end} bytes")
                    crc = zlib.crc32(data, crc)
                    remaining -= len(data)
            self._crc[ref] = (end, crc)
        return crc


class SnapshotSpool:
    """The snapshot files of the machine whose database is `directory` (`name` in logs).
    `executor` runs the dumps; `start_dump` starts one of the applied state."""

    def __init__(self, directory: Path, name: str,
                 executor: Callable[[], concurrent.futures.Executor],
                 start_dump: StartDump, pace: Pace | None = None) -> None:
        self.name = name
        self._executor = executor
        self._start_dump = start_dump
        self.pace = pace
        self._paused = False  # a wake-up is scheduled for when the pace allows a chunk
        self._outgoing_path = directory.with_name(directory.name + ".snapshot-out")
        self._incoming_path = directory.with_name(directory.name + ".snapshot-in")
        # Where a dump links the files it sends as they are (DumpWriter's inserts).
        self.links = directory.with_name(directory.name + ".snapshot-links")
        for leftover in (self._outgoing_path, self._incoming_path):
            leftover.unlink(missing_ok=True)
        shutil.rmtree(self.links, ignore_errors=True)
        self._outgoing: tuple[int, _Stream] | None = None  # the spooled one's index, stream
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
        at, stream = outgoing
        if offset >= stream.size and not stream.complete:
            return None  # the dump is still writing it: `on_dumped` once it is over
        if self._pace_wait():
            return None
        data = stream.read(offset, CHUNK_BYTES if self.pace is None else self.pace.chunk_bytes())
        if self.pace is not None:
            self.pace.spend(len(data))
        done = stream.complete and offset + len(data) >= stream.size
        self._used = time.monotonic()
        if done:
            self.drop()
        return at, data, done

    def _pace_wait(self) -> bool:
        """Whether the chunk must wait for the pace; if so `on_dumped` is called once it
        may leave, so the core asks for it again."""
        wait = 0.0 if self.pace is None else self.pace.wait()
        if not wait:
            return False
        if not self._paused:
            self._paused = True
            asyncio.get_running_loop().call_later(wait, self._resume)
        return True

    def _resume(self) -> None:
        self._paused = False
        if self.on_dumped is not None:
            self.on_dumped()

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
        if (self._outgoing is not None and self._dumping is None
                and time.monotonic() - self._used > self.idle):
            self.drop()

    def drop(self) -> None:
        self._outgoing = None
        self._outgoing_path.unlink(missing_ok=True)
        shutil.rmtree(self.links, ignore_errors=True)

    def end_dump(self, for_good: bool = False) -> None:
        """Blocking: stops a dump under way (its thread ends soon), before what it reads is
        closed under it; `for_good`: none starts any more (the node is stopping)."""
        self._refuse_dumps = self._refuse_dumps or for_good
        dump = self._dumping
        if dump is None:
            return
        dump.stop.set()
        if dump.job is not None:
            concurrent.futures.wait([dump.job])
        self._dumped(dump)

    def _dump(self, applied: int) -> None:
        if self._dumping is not None or self._refuse_dumps:
            return
        write, release = self._start_dump()
        loop = asyncio.get_running_loop()
        dump = _Dump(applied, threading.Event(), release, loop.create_future())

        def spliced(stream: _Stream) -> None:
            loop.call_soon_threadsafe(self._spliced, dump, stream)

        try:
            job = dump.job = self._executor().submit(
                _write_dump, self._outgoing_path, write, dump.stop, spliced)
        except BaseException:
            release()
            raise
        self._dumping = dump
        self.dumped = dump.done
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._dumped, dump))

    def _spliced(self, dump: _Dump, stream: _Stream) -> None:
        """On the loop: the dump's files may leave (the stream up to their end)."""
        if self._dumping is dump and self._outgoing is None:
            dump.stream = stream
            self._outgoing = (dump.index, stream)
            self._used = time.monotonic()
            if self.on_dumped is not None:
                self.on_dumped()

    def _dumped(self, dump: _Dump) -> None:
        """On the loop, once the dump's thread ended (or at once, by `end_dump`)."""
        if self._dumping is not dump:
            return  # ended already
        self._dumping = None
        dump.release()
        job = dump.job
        assert job is not None
        if job.cancelled() or job.exception() is not None:
            if not dump.stop.is_set():
                log.warning("snapshot of %s at index %d failed: %r", self.name, dump.index,
                            job.exception())
            if self._outgoing is not None and self._outgoing[1] is dump.stream:
                self._outgoing = None  # its transfers start over
            self._outgoing_path.unlink(missing_ok=True)
            shutil.rmtree(self.links, ignore_errors=True)
        else:
            stream, size = job.result()
            stream.finish(size)
            self._outgoing = (dump.index, stream)
            self._used = time.monotonic()
            if self.on_dumped is not None:
                self.on_dumped()
        if not dump.done.done():  # a waiter cancelled by its timeout cancels it
            dump.done.set_result(None)
