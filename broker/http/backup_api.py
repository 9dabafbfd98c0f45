"""Backup and restore over HTTP (issue 39; /work/helpers/BACKUP_CONTRACT.md):

- `POST /api/v5/data/export[?since=µs|RFC3339]`: the archive, streamed as it is written
  (`application/x-tar`), its manifest's SHA-256 in `X-Backup-Manifest-Sha256`;
- `POST /api/v5/data/import` (body: an archive, or `multipart/mixed` of a full archive and
  its increments, oldest first, a part each): 200 `{"restored": {...}}`, 409 NOT_EMPTY,
  400 BAD_ARCHIVE (damaged, or archives that do not follow one another), 503 UNAVAILABLE
  (replicated: this node's groups cannot commit), 409 CLUSTER_VERSION (replicated: the
  cluster's effective version does not allow the LOAD commands an import writes).

POSTs, so a viewer key is refused (auth.py). One export or import at a time per node (409
BUSY): each holds LevelDB snapshots or swaps databases. An import's archive is unpacked as
it arrives (several, or one compressed, go to files in the data dir first) into directories
nothing uses: every checksum is checked before anything changes.
"""

import asyncio
import concurrent.futures
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from aiohttp import BodyPartReader, web

from broker.backup.archive import CHUNK, BadArchive, Opens
from broker.backup.body import Body, SocketBody, socket_fd
from broker.backup.collect import ExportFailed, Replicated
from broker.backup.export import export
from broker.backup.manifest import parse_time
from broker.backup.pipe import Pipe
from broker.backup.restore import ImportRefused, Target, import_online
from broker.http.common import NODE_KEY
from broker.http.request_body import Received, feed

GROUPS_KEY: Final = web.AppKey("backup_groups", object)
_LOAD_REFUSAL_KEY: Final = web.AppKey("backup_load_refusal", object)
_BUSY_KEY: Final = web.AppKey("backup_busy", asyncio.Lock)
_IDLE_KEY: Final = web.AppKey("backup_upload_idle_s", float)
_STATUS: Final = {"NOT_EMPTY": 409, "BAD_ARCHIVE": 400, "UNAVAILABLE": 503,
                   "CLUSTER_VERSION": 409}
MANIFEST_HEADER: Final = "X-Backup-Manifest-Sha256"
_GZIP: Final = b"\x1f\x8b"
_ONE: Final = "the archive"


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"code": code, "message": message}, status=status)


def _busy(request: web.Request) -> web.Response | None:
    if request.app[_BUSY_KEY].locked():
        return _error(409, "BUSY", "an export or import is running on this node")
    return None


def _groups(request: web.Request) -> Replicated | None:
    return request.app.get(GROUPS_KEY)  # type: ignore[return-value]


async def export_data(request: web.Request) -> web.StreamResponse:
    node = request.app[NODE_KEY]
    if node.ds is None:
        return _error(404, "NOT_FOUND", "durable sessions are disabled: nothing to export")
    since = request.query.get("since")
    try:
        since_us = None if since is None else parse_time(since)
    except ValueError as error:
        return _error(400, "BAD_REQUEST", f"since: {error}")
    busy = _busy(request)
    if busy is not None:
        return busy
    loop = asyncio.get_running_loop()
    response = web.StreamResponse(headers={"Content-Type": "application/x-tar"})

    def open_body(raw: bytes, stopped: Callable[[], bool]) -> Body:  # on the export's thread
        response.headers[MANIFEST_HEADER] = hashlib.sha256(raw).hexdigest()
        return asyncio.run_coroutine_threadsafe(
            _open_body(request, response, stopped), loop).result()

    async with request.app[_BUSY_KEY]:
        try:
            await export(node.ds, node.retainer, _groups(request), since_us, open_body)
        except (ExportFailed, BadArchive) as error:
            if response.prepared:
                raise  # the client sees an archive cut short, which `verify` refuses
            return _error(503, "EXPORT_FAILED", str(error))
    await response.write_eof()
    return response


async def _open_body(request: web.Request, response: web.StreamResponse,
                     stopped: Callable[[], bool]) -> Body:
    """The response's headers sent and its body handed to the export's thread: the socket
    itself, or the response written by the loop where the thread cannot write to it.
    Chunked (the archive's length is known once it is written): a body cut short lacks
    its last chunk, and the archive its checksums.json."""
    await response.prepare(request)
    fd = socket_fd(request.transport)
    if fd is None:
        return _LoopBody(response, asyncio.get_running_loop())
    chunked = response.headers.get("Transfer-Encoding") == "chunked"  # (not HTTP/1.0)
    return SocketBody(fd, chunked, stopped)


class _LoopBody:
    """The archive written by the event loop (`response.write`), a chunk ahead: the thread
    makes the next while the loop writes one."""

    def __init__(self, response: web.StreamResponse, loop: asyncio.AbstractEventLoop) -> None:
        self._response = response
        self._loop = loop
        self._writing: concurrent.futures.Future[None] | None = None

    def write(self, data: bytes | memoryview) -> None:
        chunk = bytes(data)  # (a view of the thread's buffer, which it fills again)
        self.close()
        self._writing = asyncio.run_coroutine_threadsafe(self._response.write(chunk),
                                                         self._loop)

    def close(self) -> None:
        """Once the last chunk is written."""
        if self._writing is not None:
            self._writing.result()
            self._writing = None


async def import_data(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    if node.ds is None:
        return _error(404, "NOT_FOUND", "durable sessions are disabled: nothing to import")
    busy = _busy(request)
    if busy is not None:
        return busy
    async with request.app[_BUSY_KEY]:
        uploads: list[Path] = []
        target = Target(node.ds, node.retainer, node.retained_writer,
                        node.restore_durable_sessions, _groups(request),  # type: ignore[arg-type]
                        request.app[_LOAD_REFUSAL_KEY])  # type: ignore[arg-type]
        stem = node.ds.root / f"import-{os.getpid()}"
        try:
            if request.content_type.startswith("multipart/"):
                names = await _receive(request, stem, uploads)
                return _restored(await import_online(uploads, target, names))
            return await _import_one(request, stem, uploads, target)
        except ImportRefused as refused:
            return _refusal(refused)
        finally:
            for upload in uploads:
                with contextlib.suppress(FileNotFoundError):
                    upload.unlink()


def _restored(counts: dict[str, int]) -> web.Response:
    return web.json_response({"restored": counts})


def _refusal(refused: ImportRefused) -> web.Response:
    return _error(_STATUS[refused.code], refused.code, str(refused))


async def _import_one(request: web.Request, stem: Path, uploads: list[Path],
                      target: Target) -> web.Response:
    """One archive, unpacked as it arrives (pipe.py: no copy of it on disk first); one
    gzip-compressed (its first bytes say) to a file first, which tarfile reads as one. The
    response closes the connection when a thread read the body (request_body.py): aiohttp's
    parser did not see it end."""
    loop = asyncio.get_running_loop()
    pipe = Pipe(loop)
    feeding = asyncio.ensure_future(feed(request, pipe, request.app[_IDLE_KEY]))
    try:
        archive: Opens = pipe
        if await loop.run_in_executor(None, pipe.peek, len(_GZIP)) == _GZIP:
            uploads.append(stem.with_name(f"{stem.name}-0.tar"))
            await loop.run_in_executor(None, _save, pipe, uploads[-1])
            archive = uploads[-1]
        counts = await import_online([archive], target, [_ONE])
    except ImportRefused as found:
        received = await _finish(pipe, feeding)
        refused = found if received.stopped is None else ImportRefused(
            # (what the unpack found short: not the cause)
            "BAD_ARCHIVE", f"the upload stopped: {received.stopped}")
        response = _refusal(refused)
    except BaseException:  # cancelled, or failed: the body's reader stops too
        feeding.cancel()
        pipe.close()
        pipe.end()
        raise
    else:
        received = await _finish(pipe, feeding)
        response = _restored(counts)
    if received.by_thread:
        response.force_close()
    return response


async def _finish(pipe: Pipe, feeding: "asyncio.Future[Received]") -> Received:
    """Once the import has read what it needs: the rest of the body is read and dropped
    (after a refusal: the client hears it once it has sent its body)."""
    pipe.close()
    pipe.end()
    return await feeding


def _save(pipe: Pipe, path: Path) -> None:
    """Blocking: the whole body to `path`."""
    with path.open("wb") as file:
        while data := pipe.take(CHUNK, keep=False, partial=True):
            file.write(data)


async def _receive(request: web.Request, stem: Path, uploads: list[Path]) -> list[str]:
    """The archives of a `multipart/mixed` body (a part each: a full archive and its
    increments, oldest first) to files `stem`-N.tar (appended to `uploads` as each is
    begun: the chain is checked, every manifest, before any is unpacked); their names as
    the client gave them."""
    names = []
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise ImportRefused("BAD_ARCHIVE", f"part {len(uploads) + 1} of the body is itself"
                                f" multipart: send each archive as a part")
        uploads.append(stem.with_name(f"{stem.name}-{len(uploads)}.tar"))
        names.append(part.filename or f"archive {len(uploads)}")
        await _write(_part_chunks(part), uploads[-1])
    if not uploads:
        raise ImportRefused("BAD_ARCHIVE", "the multipart body holds no archive")
    return names


async def _part_chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(CHUNK):
        yield chunk


async def _write(chunks: AsyncIterator[bytes], path: Path) -> None:
    """`chunks` to `path`, written on a thread a CHUNK at a time as they arrive (the socket
    hands the body over in pieces of tens of KiB: one thread round trip each would cost
    more)."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1, thread_name_prefix="import") as pool, path.open("wb") as file:
        pending = bytearray()
        async for piece in chunks:
            pending += piece
            if len(pending) >= CHUNK:
                await loop.run_in_executor(pool, file.write, bytes(pending))
                pending.clear()
        await loop.run_in_executor(pool, file.write, bytes(pending))


def add_backup_routes(app: web.Application, groups: Any = None,
                      load_refusal: Callable[[], str | None] = lambda: None,
                      idle_s: float = 10.0) -> None:
    """`groups`: replicated Durable Storage's Raft groups (DsGroups), or None;
    `load_refusal`: why the cluster's effective version does not allow an import's LOAD
    commands yet (versions.load_refusal), None when it does; `idle_s`: how long an upload
    may go without a byte (dashboard.listeners.http.header_timeout; 0: no bound)."""
    app[_IDLE_KEY] = idle_s
    if groups is not None:
        app[GROUPS_KEY] = groups
    app[_LOAD_REFUSAL_KEY] = load_refusal
    app[_BUSY_KEY] = asyncio.Lock()
    app.router.add_post("/api/v5/data/export", export_data)
    app.router.add_post("/api/v5/data/import", import_data)
