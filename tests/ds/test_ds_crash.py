"""kill -9 of a real writer process: nothing reported durable is lost, every slab opens."""

import asyncio
import sys
from pathlib import Path

import plyvel
import pytest

from broker.ds import DurableStorage
from tests.ds import crash_writer
from tests.ds.conftest import read_all

WRITER = Path(crash_writer.__file__)


@pytest.mark.parametrize("kill_after", [5, 40, 120])
async def test_durable_batches_survive_kill_9(tmp_path: Path, kill_after: int) -> None:
    data_dir = tmp_path / "data"
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(WRITER), str(data_dir), stdout=asyncio.subprocess.PIPE,
    )
    durable: set[int] = set()
    committed: set[int] = set()
    assert process.stdout is not None
    try:
        while len(durable) < kill_after:
            line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().split()
            assert line, "writer exited early"
            (durable if line[0] == "durable" else committed).add(int(line[1]))
    finally:
        process.kill()  # SIGKILL: no flush, no close, mid-write
        await process.wait()

    for slab in sorted(data_dir.glob("ds/messages/shard-*/gen-*")):
        if slab.suffix == ".tmp":
            continue  # a generation being created when the kill came: not a slab yet
        plyvel.DB(str(slab), create_if_missing=False).close()  # every slab opens as it is

    storage = DurableStorage(data_dir, crash_writer.SETTINGS)
    # Opening cleared any half-created generation.
    assert not list(data_dir.glob("ds/messages/shard-*/gen-*.tmp"))
    try:
        stored = {m.payload.split(b"\x00")[0] for m in read_all(storage, "crash/#")}
        for batch in durable:
            expected = {b"%d:%d" % (batch, j) for j in range(crash_writer.PER_BATCH)}
            assert expected <= stored, f"batch {batch} was reported durable and is missing"
        for n in committed:
            assert storage.sessions.get(b"tx/%d" % n) == b"x"
        # batches are atomic: none is half there
        batches = {}
        for payload in stored:
            batch, _ = payload.split(b":")
            batches[batch] = batches.get(batch, 0) + 1
        assert set(batches.values()) == {crash_writer.PER_BATCH}
        if kill_after >= 40:  # small generations: the kill came after rotations
            assert any(len(s.slabs) > 1 for s in storage.messages.created_shards)
    finally:
        await storage.close()
