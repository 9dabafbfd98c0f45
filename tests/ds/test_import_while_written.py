"""An import into a running node checks that the node is empty when it starts, and again
before it swaps the built shards in, with nothing awaited in between: a message a client
published and had acknowledged meanwhile must not be swapped away. The shards are built
apart from their own staging dirs, which a shard a write created meanwhile would take for a
swap a crash cut short (files.recover_swap)."""

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from broker.backup.export import export
from broker.backup.restore import ImportRefused, Target, import_online
from broker.ds import DurableStorage
from broker.ds.storage import MESSAGES
from tests.ds.conftest import message, read_all

Open = Callable[..., DurableStorage]


class WrittenToOnSecondOpen:
    """The archive file; its second opening (the unpack's, after the check's) first has the
    node take `during` and waits until it is acknowledged."""

    def __init__(self, path: Path, node: DurableStorage, loop: asyncio.AbstractEventLoop) -> None:
        self.path, self.node, self.loop, self.opened = path, node, loop, 0

    @contextmanager
    def open(self, mode: str = "rb") -> Iterator[IO[bytes]]:
        self.opened += 1
        if self.opened == 2:
            asyncio.run_coroutine_threadsafe(self._write(), self.loop).result(30)
        with self.path.open("rb") as file:
            yield file

    async def _write(self) -> None:
        await self.node.store_batch(MESSAGES, [message("during", publisher="a-client")])


async def test_a_write_during_the_unpack_refuses_the_import_and_is_kept(
        open_storage: Open, tmp_path: Path) -> None:
    source = open_storage(tmp_path / "source", n_shards=4)
    await source.store_batch(MESSAGES, [message(f"old/{n}", publisher=f"p{n}")
                                        for n in range(20)])
    archive = tmp_path / "backup.tar"

    def body(_manifest: bytes, _stopped: Any) -> IO[bytes]:
        return archive.open("wb")

    await export(source, None, None, None, body)
    node = open_storage(tmp_path / "node", n_shards=4)
    opens = WrittenToOnSecondOpen(archive, node, asyncio.get_running_loop())
    target = Target(node, None, None, lambda: None, None)
    with pytest.raises(ImportRefused) as refused:
        await import_online([opens], target)
    assert opens.opened >= 2  # (the write happened during the import, not before it)
    assert refused.value.code == "NOT_EMPTY" and "during the import" in str(refused.value)
    assert [m.payload for m in read_all(node, "during")] == [b"during"]
    assert read_all(node, "old/+") == []  # nothing imported
    assert not (node.root / "import.staging").exists()
