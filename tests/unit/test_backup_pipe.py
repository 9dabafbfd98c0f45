"""An upload read by the import's thread as it arrives (broker/backup/pipe.py): the manifest
read first, then the whole archive from its start, checked; the loop's puts wait while the
thread is behind; a reader that stops early lets the rest of the body be dropped."""

import asyncio
import io
import tarfile

import pytest

from broker.backup import pipe as pipe_module
from broker.backup.archive import BadArchive, read_manifest, verify
from broker.backup.pipe import Pipe
from tests.unit.test_backup_archive import DATA, manifest
from tests.unit.test_backup_archive import archive as written

BIG = bytes(range(256)) * (3 * pipe_module.LIMIT // 256 + 7)  # past the pipe's limit


def archive() -> bytes:
    return written(data={**DATA, "messages/shard-000/gen-000001/000005.ldb": BIG})


async def feed(pipe: Pipe, raw: bytes, piece: int = 65536) -> int:
    """Puts `raw` in pieces; returns the most the pipe held unread after a put."""
    most = 0
    try:
        for at in range(0, len(raw), piece):
            await pipe.put(raw[at:at + piece])
            most = max(most, pipe._unread)
    finally:
        pipe.end()
    return most


async def read_twice(raw: bytes) -> tuple[str, str, int]:
    pipe = Pipe(asyncio.get_running_loop())
    feeding = asyncio.ensure_future(feed(pipe, raw))

    def read() -> tuple[str, str]:
        with pipe.open("rb") as first:
            listed = read_manifest(first)
        with pipe.open("rb") as again:
            checked = verify(again)
        return listed.created, checked.created

    listed, checked = await asyncio.get_running_loop().run_in_executor(None, read)
    pipe.close()
    return listed, checked, await feeding


def test_the_manifest_then_the_whole_archive_checked() -> None:
    listed, checked, most = asyncio.run(read_twice(archive()))
    assert listed == checked == manifest().created
    assert most < pipe_module.LIMIT + 65536  # the puts waited for the reader


def test_a_damaged_upload_is_named_and_a_third_opening_refused() -> None:
    raw = bytearray(archive())
    with tarfile.open(fileobj=io.BytesIO(bytes(raw))) as tar:
        raw[tar.getmember("messages/shard-000/gen-000001/000005.ldb").offset_data + 7] ^= 1

    async def run() -> None:
        pipe = Pipe(asyncio.get_running_loop())
        feeding = asyncio.ensure_future(feed(pipe, bytes(raw)))

        def read() -> None:
            with pipe.open("rb") as first:
                read_manifest(first)
            with pipe.open("rb") as again, pytest.raises(BadArchive, match=r"000005\.ldb"):
                verify(again)
            with pytest.raises(OSError, match="twice"):
                pipe.open("rb")

        await asyncio.get_running_loop().run_in_executor(None, read)
        pipe.close()
        await feeding

    asyncio.run(run())


def test_a_reader_that_stops_early_lets_the_body_be_dropped() -> None:
    async def run() -> int:
        pipe = Pipe(asyncio.get_running_loop())
        feeding = asyncio.ensure_future(feed(pipe, archive()))

        def read() -> None:
            with pipe.open("rb") as first:
                read_manifest(first)  # then refused: not read further

        await asyncio.get_running_loop().run_in_executor(None, read)
        pipe.close()
        return await feeding  # every put returned, though nothing read the rest

    assert asyncio.run(run()) <= pipe_module.LIMIT + 65536
