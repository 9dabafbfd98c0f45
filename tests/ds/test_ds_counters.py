"""A slab's counters are checkpointed every few MiB, not with every batch; opening a slab
counts what came after the checkpoint, so they are exact after a crash."""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple
from pathlib import Path

import pytest

from broker.ds.cook import STATS_KEY, Cooker, SlabStats
from broker.ds.slab import Slab
from broker.ds.ttv import TTV

# threshold 2 at the second level: `dev/<n>/t` turns into `dev/+/t` (index keys) after two
TOPICS = ["dev/1/t", "dev/2/t", "dev/3/t", "dev/4/t", "other"]


async def write_batches(path: Path, checkpoint_bytes: int, batches: int) -> SlabStats:
    """Writes through a cooker and leaves without a checkpoint, as a killed broker would
    (LevelDB replays its log on the next open). Returns the counters the writer had."""
    slab = Slab.create(path, 1, (100, 2), now_us=1)
    cooker = Cooker(slab.lts, slab.stats, 0, checkpoint_bytes)
    with ThreadPoolExecutor(1) as executor:
        for n in range(batches):
            ttvs = [TTV(topic, b"x" * (n + 1), 1, False, "pub") for topic in TOPICS]
            await slab.write(cooker.cook(ttvs, now_us=1000 * (n + 1)), False, executor)
    slab.db.close()
    return SlabStats(*astuple(slab.stats))


@pytest.mark.parametrize("checkpoint_bytes", [2000, 1 << 30], ids=["checkpointed", "never"])
async def test_reopened_counters_equal_the_writers(tmp_path: Path, checkpoint_bytes: int) -> None:
    written = await write_batches(tmp_path / "slab", checkpoint_bytes, batches=12)
    reopened = Slab.open(tmp_path / "slab", 1)
    try:
        assert astuple(reopened.stats) == astuple(written)
        assert written.messages == 12 * len(TOPICS)
        assert written.min_timestamp == 1000
        checkpoint = SlabStats.decode(reopened.db.get(STATS_KEY))
        if checkpoint_bytes < written.size:  # one checkpoint, at about 2/3 of the batches
            assert 0 < checkpoint.messages < written.messages
        else:
            assert checkpoint.messages == 0
    finally:
        reopened.close()


async def test_a_checkpoint_at_close_leaves_nothing_to_count(tmp_path: Path) -> None:
    written = await write_batches(tmp_path / "slab", 1 << 30, batches=3)
    slab = Slab.open(tmp_path / "slab", 1)
    slab.checkpoint()
    slab.close()
    slab = Slab.open(tmp_path / "slab", 1)
    try:
        assert astuple(SlabStats.decode(slab.db.get(STATS_KEY))) == astuple(written)
    finally:
        slab.close()
