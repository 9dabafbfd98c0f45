"""Durable groups' backlogs, counted again only where something changed (group_views.py):
which count stands, which goes on from where it stopped, which starts again."""

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from broker.ds import Iterator as DSIterator
from broker.ds import Stream, StreamWrite
from broker.session.durable.group_views import BACKLOG_CAP, Backlogs, count_from

STREAM = Stream("messages", 3, 1, 7)


def test_a_count_stands_until_its_stream_is_written_or_a_generation_goes() -> None:
    counted = (50, 90, 4, 10)  # from position 50, examined up to 90: 4, after change 10
    assert count_from(counted, 50, 50, written=10, cleared=0) is None
    assert count_from(counted, 50, 50, written=11, cleared=0) == (90, 4)  # goes on
    assert count_from(counted, 50, 50, written=3, cleared=12) == (90, 4)


def test_a_moved_position_or_no_count_starts_again_and_an_end_or_the_cap_stands() -> None:
    assert count_from(None, 0, 99, written=0, cleared=0) == (99, 0)
    assert count_from((50, 90, 4, 10), 60, 60, written=0, cleared=0) == (60, 0)
    assert count_from((50, None, 4, 10), 50, 50, written=20, cleared=20) is None
    assert count_from((50, 90, BACKLOG_CAP, 10), 50, 50, written=20, cleared=0) is None


@dataclass
class FakeStorage:
    """Timestamps of one stream's messages, read `n` at a time; every read counted."""

    stamps: list[int] = field(default_factory=list)
    sealed: bool = False
    reads: int = 0
    change_listeners: list[Any] = field(default_factory=list)

    def write(self, *stamps: int) -> None:
        self.stamps.extend(stamps)
        for listener in self.change_listeners:
            listener(STREAM.shard, STREAM.generation, {STREAM.id: StreamWrite()})

    def seal(self) -> None:
        self.sealed = True
        for listener in self.change_listeners:
            listener(STREAM.shard, STREAM.generation, None)

    def next(self, iterator: DSIterator, n: int) -> tuple[DSIterator | None, list[int]]:
        self.reads += 1
        after = [t for t in self.stamps if t > iterator.position][:n]
        if not after:
            return (None if self.sealed else iterator), []
        return DSIterator(iterator.stream, iterator.topic_filter, after[-1]), after


def run(steps: Generator[None, None, list[int]]) -> list[int]:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return list(done.value)


def test_backlogs_read_only_what_was_written_since_and_again_after_a_move() -> None:
    ds = FakeStorage([10, 20, 30])
    backlogs = Backlogs(ds)  # type: ignore[arg-type]

    def count(position: int | None) -> int:
        (backlog,) = run(backlogs.count("$share/g/t", 5, "t", [STREAM], {STREAM: position}))
        return backlog

    assert count(0) == 3 and ds.reads == 2  # from where the group started: all of it
    assert count(0) == 3 and ds.reads == 2  # nothing written since: no read
    ds.write(40, 50)
    assert count(0) == 5 and ds.reads == 4  # what was written since, from 30 on
    assert count(20) == 3 and ds.reads == 6  # the group read up to 20: counted again
    ds.seal()
    assert count(20) == 3 and ds.reads == 7  # the end of the sealed stream, found once
    assert count(20) == 3 and ds.reads == 7
    assert count(None) == 0 and ds.reads == 7  # the group read it to its end


def test_a_count_is_found_again_when_the_streams_come_in_another_order() -> None:
    """A new generation's stream comes first: the others' counts still stand."""
    ds = FakeStorage([10, 20, 30])
    backlogs = Backlogs(ds)  # type: ignore[arg-type]
    other, new = Stream("messages", 4, 1, 7), Stream("messages", 3, 2, 7)
    assert run(backlogs.count("$share/g/t", 5, "t", [STREAM, other], {})) == [3, 3]
    assert ds.reads == 4
    assert run(backlogs.count("$share/g/t", 5, "t", [new, STREAM, other], {})) == [3, 3, 3]
    assert ds.reads == 6  # the new one's only
