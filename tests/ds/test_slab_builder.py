"""shard_snapshot.SlabBuilder: a shard snapshot's records become its slabs in whatever
pieces they come (a transfer's chunks cut records anywhere), each slab written out as
tables, so the shard's reopen reads no log back."""

import random
import struct
from pathlib import Path

import plyvel  # type: ignore[import-untyped]
import pytest

from broker.ds.replication_layer import BadCommand
from broker.ds.shard import generation_dir
from broker.ds.shard_snapshot import PAIR_RECORD, SLAB, SLAB_RECORD, SlabBuilder
from broker.ds.slab import CHECKPOINT_KEY

_HEAD = struct.Struct(">BI")


def record(kind: int, body: bytes) -> bytes:
    return _HEAD.pack(kind, len(body)) + body


def pair(key: bytes, value: bytes) -> bytes:
    return record(PAIR_RECORD, struct.pack(">I", len(key)) + key + value)


def stream(pairs: dict[bytes, bytes]) -> bytes:
    return record(SLAB_RECORD, SLAB.pack(7, 1, 0) + b"[]") + b"".join(
        pair(key, value) for key, value in sorted(pairs.items()))


def built(directory: Path) -> dict[bytes, bytes]:
    db = plyvel.DB(str(generation_dir(directory, 7)))
    try:
        return dict(db.iterator())
    finally:
        db.close()


def test_records_cut_anywhere_build_the_same_slab(tmp_path: Path) -> None:
    rng = random.Random(7)
    pairs = {b"k%05d" % n: bytes(rng.randrange(300)) for n in range(2_000)}
    data = stream(pairs)
    builder = SlabBuilder(tmp_path / "built", None)
    at = 0
    while at < len(data):  # pieces of 1 to 700 bytes: heads and pairs split anywhere
        step = rng.randint(1, 700)
        builder.feed(data[at:at + step])
        at += step
    builder.finish(0, 42, 3, [(b"last", b"meta")])
    slab = built(builder.directory)
    assert {key: slab[key] for key in pairs} == pairs
    assert slab[b"last"] == b"meta" and CHECKPOINT_KEY in slab
    log = [p for p in generation_dir(builder.directory, 7).glob("*.log")]
    assert all(p.stat().st_size == 0 for p in log)  # written out as tables


def test_a_snapshot_cut_short_is_refused_and_what_it_wrote_goes(tmp_path: Path) -> None:
    data = stream({b"a": b"1", b"b": b"2"})
    builder = SlabBuilder(tmp_path / "built", None)
    builder.feed(data[:-1])
    with pytest.raises(BadCommand):
        builder.finish(0, 1, 1, [])
    builder.close()
    assert not builder.directory.exists()


def test_records_before_any_slab_are_refused(tmp_path: Path) -> None:
    builder = SlabBuilder(tmp_path / "built", None)
    with pytest.raises(BadCommand):
        builder.feed(record(9, b"x"))
    builder.close()
