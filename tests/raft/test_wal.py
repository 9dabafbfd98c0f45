"""The Raft write-ahead log on real files: recovery, torn tails, corruption, segment
deletion and group commit."""

import os
from pathlib import Path

import pytest

from broker.raft.messages import NORMAL, Config, Entry
from broker.raft.ready import HardState, SnapshotMeta
from broker.raft.wal import FileStore, WalCorrupt, WriteAheadLog


def _entries(first: int, count: int, term: int = 1, size: int = 10) -> list[Entry]:
    return [Entry(i, term, NORMAL, b"%0*d" % (size, i)) for i in range(first, first + count)]


def _open(directory: Path, segment_bytes: int = 1 << 20) -> tuple[WriteAheadLog, dict]:
    wal = WriteAheadLog(FileStore(str(directory)), segment_bytes=segment_bytes)
    return wal, wal.recover()


def _commit(wal: WriteAheadLog) -> None:
    wal.commit(wal.take())


def test_recovers_term_vote_and_entries_of_many_groups(tmp_path: Path) -> None:
    wal, _ = _open(tmp_path)
    for group in range(16):
        wal.hard_state(group, HardState(group + 1, f"n{group % 3}"))
        wal.entries(group, _entries(1, 20, term=1))
    _commit(wal)
    # Group 5: a new leader replaces entries 11.. with ones of term 2; then a new term.
    wal.entries(5, _entries(11, 3, term=2))
    wal.hard_state(5, HardState(9, None))
    _commit(wal)

    _, groups = _open(tmp_path)
    assert sorted(groups) == list(range(16))
    assert (groups[0].term, groups[0].vote, groups[0].log.last_index) == (1, "n0", 20)
    five = groups[5]
    assert (five.term, five.vote, five.log.last_index) == (9, None, 13)
    assert [e.term for e in five.log.entries[9:]] == [1, 2, 2, 2]
    assert five.log.entries[12].data == b"%010d" % 13


def test_a_torn_tail_is_cut_to_the_last_whole_record(tmp_path: Path) -> None:
    wal, _ = _open(tmp_path)
    wal.entries(1, _entries(1, 5))
    _commit(wal)
    wal.entries(1, _entries(6, 5))
    _commit(wal)
    (segment,) = tmp_path.iterdir()
    whole = segment.stat().st_size
    with open(segment, "r+b") as file:  # the second record half written
        file.truncate(whole - 30)
    _, groups = _open(tmp_path)
    assert groups[1].log.last_index == 5
    first = sorted(tmp_path.iterdir())[0]
    size = first.stat().st_size
    # Garbage after the last record (a write that never completed) is cut too.
    with open(first, "ab") as file:
        file.write(b"\x00\x00\x10\x00garbage")
    _, groups = _open(tmp_path)
    assert groups[1].log.last_index == 5
    assert first.stat().st_size == size


def test_a_corrupt_record_in_the_middle_refuses_to_start(tmp_path: Path) -> None:
    wal, _ = _open(tmp_path)
    for first in (1, 6, 11):
        wal.entries(1, _entries(first, 5))
        _commit(wal)
    (segment,) = tmp_path.iterdir()
    data = bytearray(segment.read_bytes())
    second = data.index(b"%010d" % 6)  # inside the second record's payload
    data[second] ^= 0xFF
    segment.write_bytes(bytes(data))
    with pytest.raises(WalCorrupt) as error:
        _open(tmp_path)
    message = str(error.value)
    assert segment.name in message and "offset" in message
    assert error.value.offset < second < error.value.offset + 200


def test_a_corrupt_older_segment_refuses_to_start(tmp_path: Path) -> None:
    wal, _ = _open(tmp_path, segment_bytes=300)
    for first in range(1, 40, 3):
        wal.entries(1, _entries(first, 3))
        _commit(wal)
    segments = sorted(tmp_path.iterdir())
    assert len(segments) > 2
    with open(segments[0], "ab") as file:  # damage at the end of a segment that is not last
        file.write(b"\x00\x00\x00\x01")
    with pytest.raises(WalCorrupt, match=segments[0].name):
        _open(tmp_path)


def test_segments_are_deleted_once_every_group_compacted_past_them(tmp_path: Path) -> None:
    config = Config(frozenset({"a", "b", "c"}))
    wal, _ = _open(tmp_path, segment_bytes=400)
    for first in range(1, 61, 3):
        for group in (1, 2):
            wal.entries(group, _entries(first, 3))
        _commit(wal)
    segments = len(list(tmp_path.iterdir()))
    assert segments > 5
    wal.snapshot(1, SnapshotMeta(50, 1, config))
    _commit(wal)
    assert len(list(tmp_path.iterdir())) >= segments  # group 2 still needs them all
    wal.snapshot(2, SnapshotMeta(50, 1, config))
    _commit(wal)
    remaining = len(list(tmp_path.iterdir()))
    assert remaining < segments / 2

    _, groups = _open(tmp_path)
    for group in (1, 2):
        log = groups[group].log
        assert (log.snapshot_index, log.last_index, log.snapshot_config) == (50, 60, config)
        assert log.entries[0].index == 51 and log.entries[-1].data == b"%010d" % 60


def test_group_commit_makes_all_groups_durable_with_one_fdatasync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal, _ = _open(tmp_path)
    _commit(wal)  # creates the segment
    calls: list[int] = []
    real = os.fdatasync
    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    for group in range(16):
        wal.hard_state(group, HardState(3, "n1"))
        wal.entries(group, _entries(1, 50))
    _commit(wal)
    assert len(calls) == 1
    assert wal.last_batch_entries == 16 * 50
    _, groups = _open(tmp_path)
    assert all(groups[g].log.last_index == 50 for g in range(16))


def test_an_installed_snapshot_replaces_the_log(tmp_path: Path) -> None:
    config = Config(frozenset({"a", "b"}), frozenset({"c"}))
    wal, _ = _open(tmp_path)
    wal.entries(1, _entries(1, 10, term=1))
    wal.snapshot(1, SnapshotMeta(30, 4, config))  # no entry 30 of term 4 here: replaced
    wal.entries(1, _entries(31, 2, term=4))
    _commit(wal)
    _, groups = _open(tmp_path)
    log = groups[1].log
    assert (log.snapshot_index, log.snapshot_term, log.last_index) == (30, 4, 32)
    assert log.config == config
