"""The streaming source's positions without Spark: what the data directory lists, which
generations a batch reads, admission control, Trigger.AvailableNow's target, a replayed
first batch, and generations dropped before they were read."""

import json
import shutil
from pathlib import Path

import pytest

import generations as g
import slabs
from generations import ShardListing
from tests.support.slabdata import N_SHARDS, sample_messages, write_generations


def test_listing_stops_at_the_first_unsealed_generation(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    write_generations(data_dir, [sample_messages(0, 80), sample_messages(80, 80),
                                 sample_messages(160, 10)], [True, True, False])
    messages = data_dir / "ds" / "messages"
    assert g.listing(messages) == {s: ShardListing(1, 2) for s in range(N_SHARDS)}
    assert g.listing(messages, 2) == {2: ShardListing(1, 2)}
    # A seal still under way (generation 1's manifest not written yet) hides what follows.
    (messages / "shard-001" / "gen-000001" / "manifest.json").unlink()
    # Retention took shard 3's generation 1.
    shutil.rmtree(messages / "shard-003" / "gen-000001")
    listed = g.listing(messages)
    assert (listed[1], listed[3]) == (ShardListing(1, 0), ShardListing(2, 2))


SHARDS = {0: ShardListing(1, 3), 1: ShardListing(4, 5)}


def test_every_sealed_generation_once_in_order() -> None:
    start = g.initial(SHARDS)
    assert start == {0: (1, 0), 1: (4, 3)}
    end = g.advance(start, SHARDS)
    assert end == {0: (1, 3), 1: (4, 5)}
    assert g.to_read(start, end) == [(0, 1), (0, 2), (0, 3), (1, 4), (1, 5)]
    # Nothing new: the same offset (Spark runs no batch), and nothing to read.
    assert g.advance(end, SHARDS) == end
    assert g.to_read(end, end) == []
    # A new generation on one shard: only it.
    later = g.advance(end, {0: ShardListing(1, 4), 1: ShardListing(4, 5)})
    assert later == {0: (4, 4), 1: (4, 5)}
    assert g.to_read(end, later) == [(0, 4)]


def test_max_slabs_takes_the_oldest_generations_across_shards() -> None:
    start = g.initial(SHARDS)
    first = g.advance(start, SHARDS, max_slabs=2)
    assert g.to_read(start, first) == [(0, 1), (0, 2)]
    second = g.advance(first, SHARDS, max_slabs=2)
    assert g.to_read(first, second) == [(0, 3), (1, 4)]
    third = g.advance(second, SHARDS, max_slabs=2)
    assert g.to_read(second, third) == [(1, 5)]
    assert g.advance(third, SHARDS, max_slabs=2) == third


def test_available_now_stops_at_its_target() -> None:
    target = {0: 2}  # shard 1 appeared after the query began: not in this run
    end = g.advance(g.initial(SHARDS), {0: ShardListing(1, 9), 1: ShardListing(4, 5)},
                    target=target)
    assert g.to_read(g.initial(SHARDS), end) == [(0, 1), (0, 2)]


def test_a_replayed_first_batch_reads_what_its_logged_end_names() -> None:
    """Spark replays an uncommitted first batch from a recomputed initial offset; retention
    may have moved it meanwhile. The batch is still the logged end's generations."""
    end = g.advance(g.initial(SHARDS), SHARDS)
    later_initial = g.initial({0: ShardListing(2, 3), 1: ShardListing(4, 5)})
    assert g.to_read(later_initial, end) == g.to_read(g.initial(SHARDS), end)


def test_generations_dropped_before_they_were_read_fail() -> None:
    start = {0: (1, 3), 1: (4, 5)}
    with pytest.raises(g.DroppedError, match=r"shard 0 generations 4-5 dropped \(by retention\)"
                                             " before this query read it"):
        g.advance(start, {0: ShardListing(6, 7), 1: ShardListing(4, 5)})
    with pytest.raises(g.DroppedError, match="shard 1 generation 6 dropped"):
        g.advance(start, {0: ShardListing(1, 3), 1: ShardListing(7, 7)})
    # Dropped after they were read: nothing is missing.
    assert g.advance(start, {0: ShardListing(4, 4), 1: ShardListing(6, 6)}) == {
        0: (4, 4), 1: (6, 6)}


def test_offsets_round_trip_as_deterministic_json() -> None:
    ranges = {10: (3, 4), 2: (1, 0)}
    offset = g.to_json(ranges)
    assert json.dumps(offset) == '{"format": 1, "shards": {"2": [1, 0], "10": [3, 4]}}'
    assert g.from_json(json.loads(json.dumps(offset))) == ranges
    with pytest.raises(slabs.ReaderError, match="unknown format"):
        g.from_json({"format": 2, "shards": {}})
    assert g.slab_count([(None, offset), (offset, g.to_json({10: (5, 6), 2: (1, 0)}))]) == 4
