"""The streaming source's positions: which sealed generations of each shard a query has
read, and which it reads next. No Spark here: the stream reader (mqtt_ds.py) only feeds it
what the data directory holds.

An offset is JSON, per shard the generations the batch that produced it read:
`{"format": 1, "shards": {"0": [5, 7], "1": [3, 2]}}` says batch N read generations 5 to 7
of shard 0 and none of shard 1 (an empty range: from > to), and that every generation up
to 7 (2) is read. The next batch starts after `to`. Ranges, not only watermarks, because
Spark replays an uncommitted first batch from a recomputed initial offset: the batch's
generations are then the ones its logged end offset names, whatever retention dropped
meanwhile, so a replay reads exactly what the first attempt read or fails.

A shard's generations are numbered one after the other (broker/ds/shard.py) and retention
drops the oldest first, so a generation below the oldest present one that the query never
read was dropped unread: that is an error naming it, not a gap skipped. A seal completes in
the background, so a query stops at a shard's first generation without a manifest.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import slabs
from broker.ds.manifest import NAME as MANIFEST

FORMAT = 1
Offset = dict[str, Any]
Ranges = dict[int, tuple[int, int]]


class DroppedError(slabs.ReaderError):
    """Generations the query had not read are gone (retention dropped them)."""


@dataclass(frozen=True, slots=True)
class ShardListing:
    """A shard's slabs as the driver sees them now."""

    oldest: int  # the lowest generation present
    sealed: int  # the highest generation of the unbroken sealed run from `oldest`


def listing(messages: Path, shard: int | None = None) -> dict[int, ShardListing]:
    """Every shard (or only `shard`) that has a slab, from directory names and the
    presence of manifests only: cheap enough for every trigger."""
    found: dict[int, ShardListing] = {}
    for number, shard_dir in slabs.shard_dirs(messages, shard):
        present = slabs.slab_dirs(shard_dir)
        if not present:
            continue
        oldest = present[0][0]
        sealed = oldest - 1
        for generation, slab_dir in present:
            if generation != sealed + 1 or not (slab_dir / MANIFEST).is_file():
                break
            sealed = generation
        found[number] = ShardListing(oldest, sealed)
    return found


def to_json(ranges: Ranges) -> Offset:
    return {"format": FORMAT, "shards": {str(s): list(ranges[s]) for s in sorted(ranges)}}


def from_json(offset: Mapping[str, Any]) -> Ranges:
    if offset.get("format") != FORMAT:
        raise slabs.ReaderError(f"mqtt-ds offset of an unknown format: {dict(offset)}")
    return {int(shard): (int(span[0]), int(span[1]))
            for shard, span in offset["shards"].items()}


def initial(shards: Mapping[int, ShardListing]) -> Ranges:
    """Before anything is read: every shard just before its oldest generation kept."""
    return {shard: (state.oldest, state.oldest - 1) for shard, state in shards.items()}


def read_up_to(start: Ranges, shard: int, state: ShardListing) -> int:
    """The last generation of `shard` read (or before the query's start)."""
    return start[shard][1] if shard in start else state.oldest - 1


def advance(
    start: Ranges, shards: Mapping[int, ShardListing], max_slabs: int | None = None,
    target: Mapping[int, int] | None = None,
) -> Ranges:
    """The end offset of the next batch: every sealed generation after `start`, at most
    `max_slabs` of them (the oldest generation numbers first, across shards), none past
    `target` (per shard, set when a Trigger.AvailableNow query began). Raises DroppedError
    if generations after `start` were dropped before they were read."""
    candidates: list[tuple[int, int]] = []  # (generation, shard)
    for shard, state in shards.items():
        after = read_up_to(start, shard, state)
        if state.oldest > after + 1:
            raise DroppedError(_dropped(shard, after + 1, state.oldest - 1))
        top = state.sealed if target is None else min(state.sealed, target.get(shard, after))
        candidates.extend((generation, shard) for generation in range(after + 1, top + 1))
    chosen = sorted(candidates)[:max_slabs]
    end = dict(start)
    for shard, state in shards.items():
        taken = [generation for generation, s in chosen if s == shard]
        after = read_up_to(start, shard, state)
        if taken:
            end[shard] = (after + 1, max(taken))
        elif shard not in end:
            end[shard] = (after + 1, after)
    return end


def to_read(start: Ranges, end: Ranges) -> list[tuple[int, int]]:
    """(shard, generation) of a batch from `start` to `end`: each shard's range in `end`
    unless it is `start`'s own (nothing new for that shard)."""
    return [(shard, generation) for shard, (first, last) in sorted(end.items())
            if start.get(shard) != (first, last) for generation in range(first, last + 1)]


def slab_count(offsets: Iterable[tuple[Mapping[str, Any] | None, Mapping[str, Any]]]) -> int:
    """Slabs read by batches given as (start, end) offsets (start None: the first)."""
    return sum(len(to_read(from_json(start) if start else {}, from_json(end)))
               for start, end in offsets)


def missing(messages: Path, shard: int, generation: int) -> DroppedError:
    return DroppedError(_dropped(shard, generation, generation) + f" ({messages})")


def _dropped(shard: int, first: int, last: int) -> str:
    which = f"generation {first}" if first == last else f"generations {first}-{last}"
    return (f"shard {shard} {which} dropped (by retention) before this query read it; "
            "its messages cannot be delivered exactly once: start a new query "
            "(a new checkpoint) to continue from the oldest generation kept")
