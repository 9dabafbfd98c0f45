"""table_writer.TableWriter and bulk.Build: databases written as LevelDB tables from pairs
in key order are LevelDB's own: opened with paranoid checks, read back with every block's
checksum verified, written to, reopened and compacted; late pairs and pairs out of order
read as LevelDB's write path would have left them; a crash before CURRENT leaves no
database."""

import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import plyvel  # type: ignore[import-untyped]
import pytest

from broker.ds.bulk import Build
from broker.ds.table_writer import LATE_LEVEL, LEVEL, TABLE_BYTES, TableWriter

_PAST: bytes = b"\xff" * 300  # after every key here


def opened(path: Path) -> plyvel.DB:
    return plyvel.DB(str(path), paranoid_checks=True)


def read_all(db: plyvel.DB) -> dict[bytes, bytes]:
    read = list(db.iterator(verify_checksums=True, fill_cache=False))
    assert [key for key, _ in read] == sorted(key for key, _ in read)
    return dict(read)


def check(path: Path, expected: dict[bytes, bytes]) -> None:
    """The database at `path` holds `expected`, by scan and by point reads, then still does
    after a write, a reopen and a compaction of everything."""
    db = opened(path)
    try:
        assert read_all(db) == expected
        for key, value in expected.items():
            assert db.get(key, verify_checksums=True) == value
        assert db.get(b"\x00absent") is None
        db.put(b"new", b"write")
        db.delete(next(iter(expected), b"new"))
    finally:
        db.close()
    changed = {**expected, b"new": b"write"}
    changed.pop(next(iter(expected), b"new"))
    db = opened(path)
    try:
        assert read_all(db) == changed
        db.compact_range(start=b"", stop=_PAST)
        assert read_all(db) == changed
    finally:
        db.close()
    db = opened(path)
    try:
        assert read_all(db) == changed
    finally:
        db.close()


def write(path: Path, pairs: dict[bytes, bytes],
          late: list[tuple[bytes, bytes]] | None = None) -> TableWriter:
    writer = TableWriter(path, sync=True)
    for key, value in sorted(pairs.items()):
        assert writer.add(key, value)
    writer.finish(late or [])
    return writer


def levels(path: Path) -> dict[int, int]:
    """Table files per level, as LevelDB reports them."""
    db = opened(path)
    try:
        return {level: int(db.get_property(b"leveldb.num-files-at-level%d" % level))
                for level in range(7)}
    finally:
        db.close()


def random_pairs(seed: int, n: int) -> dict[bytes, bytes]:
    """Keys sharing prefixes of every length (and none), some long; values empty to large."""
    rng = random.Random(seed)
    stems = [rng.randbytes(rng.choice((0, 1, 3, 12, 40))) for _ in range(20)]
    pairs: dict[bytes, bytes] = {}
    while len(pairs) < n:
        key = rng.choice(stems) + rng.randbytes(rng.choice((0, 1, 2, 8, 300)))
        pairs[key] = rng.randbytes(rng.choice((0, 0, 5, 100, 3000, 20_000)))
    return pairs


@pytest.mark.parametrize("seed", range(6))
def test_random_key_sets_read_back_equal(tmp_path: Path, seed: int) -> None:
    pairs = random_pairs(seed, [1, 2, 17, 300, 2_000, 5_000][seed])
    write(tmp_path / "db", pairs)
    check(tmp_path / "db", pairs)


@pytest.mark.parametrize("pairs", [
    {}, {b"": b""}, {b"one": b""}, {b"": b"empty key"}, {b"k" * 70_000: b"v" * 70_000},
    {b"a": b"1", b"a\x00": b"2", b"a\x00\x00": b"3", b"a\x01": b"", b"b": b"\xff" * 9},
], ids=["empty", "empty-pair", "empty-value", "empty-key", "long", "prefixes"])
def test_edge_pairs_read_back_equal(tmp_path: Path, pairs: dict[bytes, bytes]) -> None:
    write(tmp_path / "db", pairs)
    check(tmp_path / "db", pairs)


def test_many_blocks_and_files_sit_at_the_deepest_level(tmp_path: Path) -> None:
    rng = random.Random(1)
    pairs = {b"D%08d" % n: rng.randbytes(rng.randrange(400)) for n in range(40_000)}
    writer = write(tmp_path / "db", pairs)
    tables = sorted((tmp_path / "db").glob("*.ldb"))
    assert len(tables) > 3 and writer.count == len(pairs)  # (~9 MB)
    assert all(TABLE_BYTES <= path.stat().st_size < TABLE_BYTES * 1.05
               for path in tables[:-1])
    assert levels(tmp_path / "db") == {**dict.fromkeys(range(7), 0), LEVEL: len(tables)}
    check(tmp_path / "db", pairs)


def test_late_pairs_after_the_run_end_it(tmp_path: Path) -> None:
    write(tmp_path / "db", {b"a": b"1", b"b": b"2"}, [(b"z", b"late"), (b"c", b"3")])
    assert levels(tmp_path / "db")[LATE_LEVEL] == 0
    check(tmp_path / "db", {b"a": b"1", b"b": b"2", b"c": b"3", b"z": b"late"})


def test_late_pairs_inside_the_run_win_from_level_0(tmp_path: Path) -> None:
    pairs = {b"k%05d" % n: b"old" for n in range(3_000)}
    late = [(b"k00010", b"first"), (b"a", b"new"), (b"k00010", b"second"), (b"k02999", b"")]
    write(tmp_path / "db", pairs, late)
    assert levels(tmp_path / "db")[LATE_LEVEL] == 1
    check(tmp_path / "db", {**pairs, b"a": b"new", b"k00010": b"second", b"k02999": b""})


def test_a_pair_out_of_order_is_refused(tmp_path: Path) -> None:
    writer = TableWriter(tmp_path / "db", sync=False)
    assert writer.add(b"b", b"1")
    assert not writer.add(b"b", b"again") and not writer.add(b"a", b"before")
    assert writer.add(b"c", b"3")
    writer.finish()
    check(tmp_path / "db", {b"b": b"1", b"c": b"3"})


def test_the_writer_wants_a_directory_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    with pytest.raises(FileExistsError):
        TableWriter(tmp_path / "db", sync=False)


def shuffled(seed: int) -> Iterator[tuple[bytes, bytes]]:
    """Sorted pairs, then some out of order (earlier keys rewritten, new ones before)."""
    rng = random.Random(seed)
    yield from ((b"k%05d" % n, b"v%d" % n) for n in range(0, 4_000, 2))
    for _ in range(500):
        yield b"k%05d" % rng.randrange(4_000), rng.randbytes(rng.randrange(50))


@pytest.mark.parametrize("compression", [None, "snappy"])
def test_a_build_takes_pairs_in_any_order_as_leveldb_would(tmp_path: Path,
                                                           compression: str | None) -> None:
    expected: dict[bytes, bytes] = {}
    build = Build(tmp_path / "db", compression)
    for key, value in shuffled(3):
        build.put(key, value)
        expected[key] = value
    late = [(b"k00001", b"late"), (b"zz", b"after")]
    assert not build.finish(late)  # (out of order: through LevelDB from there)
    check(tmp_path / "db", {**expected, **dict(late)})


def test_a_build_of_sorted_pairs_is_written_as_tables(tmp_path: Path) -> None:
    build = Build(tmp_path / "db", None)
    for n in range(1_000):
        build.put(b"k%05d" % n, b"v")
    assert build.finish([(b"A", b"checkpoint")])  # as tables
    assert not list((tmp_path / "db").glob("*.log"))  # no LevelDB write path
    check(tmp_path / "db", {b"A": b"checkpoint", **{b"k%05d" % n: b"v" for n in range(1_000)}})


_KILLED_BEFORE_CURRENT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from broker.ds.table_writer import TableWriter

    def killed(source, target):
        if str(target).endswith("CURRENT"):
            os.kill(os.getpid(), signal.SIGKILL)
        real(source, target)

    real, os.replace = os.replace, killed
    writer = TableWriter(Path(sys.argv[1]), sync=True)
    for n in range(50_000):
        writer.add(b"k%08d" % n, b"v" * 50)
    writer.finish()
""")


def test_a_crash_before_current_leaves_no_database(tmp_path: Path) -> None:
    path = tmp_path / "db"
    done = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_CURRENT, str(path)],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          timeout=60)
    assert done.returncode == -9
    assert list(path.glob("*.ldb")) and (path / "MANIFEST-000001").exists()
    assert not (path / "CURRENT").exists()
    with pytest.raises(plyvel.Error):
        plyvel.DB(str(path), create_if_missing=False)
    db = plyvel.DB(str(path), create_if_missing=True)  # as a new one: the tables go
    try:
        assert read_all(db) == {}
    finally:
        db.close()
    assert not list(path.glob("*.ldb")) and not list(path.glob("*.dbtmp"))
