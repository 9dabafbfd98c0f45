"""The write buffer's flush policy, ordering and error reporting (no disk involved)."""

import asyncio

import pytest

from broker.ds.buffer import WriteBuffer


class Recorder:
    def __init__(self) -> None:
        self.batches: list[tuple[list[int], bool]] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None
        self.entered = asyncio.Event()  # a flush has started

    async def flush(self, items: list[int], sync: bool) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.batches.append((items, sync))


async def test_max_items_flushes_at_once() -> None:
    recorder = Recorder()
    buffer = WriteBuffer(recorder.flush, 3600, 3, 3600)  # timers would never fire
    first = buffer.add([1, 2], sync=True)
    second = buffer.add([3], sync=False)
    await asyncio.gather(first, second)
    assert recorder.batches == [([1, 2, 3], True)]


async def test_idle_interval_flushes_a_lone_writer() -> None:
    recorder = Recorder()
    buffer = WriteBuffer(recorder.flush, 3600, 1000, 0.001)
    await buffer.add([1], sync=True)
    assert recorder.batches == [([1], True)]


async def test_flush_interval_bounds_the_wait() -> None:
    recorder = Recorder()
    buffer = WriteBuffer(recorder.flush, 0.005, 1000, 3600)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await buffer.add([1], sync=True)
    assert recorder.batches == [([1], True)]
    assert loop.time() - started < 1.0


async def test_writes_without_fsync_flush_at_once() -> None:
    """Nothing to batch them for: no timer, whatever the intervals say."""
    recorder = Recorder()
    buffer = WriteBuffer(recorder.flush, 3600, 1000, 3600)  # timers would never fire
    await buffer.add([1], sync=False)
    assert recorder.batches == [([1], False)]


async def test_one_flush_at_a_time_in_order() -> None:
    recorder = Recorder()
    recorder.gate = asyncio.Event()
    buffer = WriteBuffer(recorder.flush, 3600, 2, 3600)
    first = buffer.add([1, 2], sync=False)  # starts a flush that waits at the gate
    second = buffer.add([3, 4], sync=False)  # full again, but must wait its turn
    third = buffer.add([5], sync=False)
    await asyncio.sleep(0)
    assert recorder.batches == []
    recorder.gate.set()
    await asyncio.gather(first, second, third)
    assert recorder.batches == [([1, 2], False), ([3, 4, 5], False)]


async def test_what_waited_for_a_flush_goes_next_in_the_same_task() -> None:
    """No turn of the event loop between two batches: under load a turn is a whole round
    of connections, added to every commit."""
    recorder = Recorder()
    recorder.gate = asyncio.Event()
    tasks: list[asyncio.Task[object] | None] = []
    flush = recorder.flush

    async def recording(items: list[int], sync: bool) -> None:
        tasks.append(asyncio.current_task())
        await flush(items, sync)

    buffer = WriteBuffer(recording, 3600, 1, 3600)
    first = buffer.add([1], sync=True)
    await asyncio.sleep(0)
    second = buffer.add([2], sync=True)
    recorder.gate.set()
    await asyncio.gather(first, second)
    assert recorder.batches == [([1], True), ([2], True)]
    assert len(tasks) == 2 and tasks[0] is tasks[1]


async def test_a_failed_flush_fails_every_writer_in_it() -> None:
    recorder = Recorder()
    recorder.fail = OSError("disk full")
    buffer = WriteBuffer(recorder.flush, 3600, 2, 3600)
    one = buffer.add([1], sync=True)
    two = buffer.add([2], sync=True)
    for waiter in (one, two):
        with pytest.raises(OSError, match="disk full"):
            await waiter


async def test_drain_writes_what_is_waiting() -> None:
    recorder = Recorder()
    buffer = WriteBuffer(recorder.flush, 3600, 1000, 3600)
    waiter = buffer.add([7], sync=True)
    await buffer.drain()
    assert waiter.done() and recorder.batches == [([7], True)]


async def _turns(n: int = 5) -> None:
    """Lets the event loop run whatever is ready (a flush that would start at once)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_paced_writes_without_fsync_wait_to_share_a_flush() -> None:
    """Replicated, each flush is a Raft commit on every replica: writes that need no fsync
    wait the pace interval instead of going at once, and go together."""
    recorder = Recorder()
    buffer = WriteBuffer(recorder.flush, 3600, 1000, 3600)
    buffer.pace(3600)
    one = buffer.add([1], sync=False)
    two = buffer.add([2], sync=False)
    await _turns()
    assert recorder.batches == [] and not one.done()
    await buffer.drain()
    assert recorder.batches == [([1, 2], False)] and two.done()


async def test_paced_writes_flush_once_the_pace_has_passed() -> None:
    recorder = Recorder()
    buffer = WriteBuffer(recorder.flush, 3600, 1000, 3600)
    buffer.pace(0.005)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await buffer.add([1], sync=False)
    assert recorder.batches == [([1], False)]
    assert loop.time() - started >= 0.005


async def test_a_write_with_fsync_takes_paced_ones_along_sooner() -> None:
    recorder = Recorder()
    buffer = WriteBuffer(recorder.flush, 3600, 1000, 0.001)
    buffer.pace(3600)
    paced = buffer.add([1], sync=False)
    await _turns()
    await buffer.add([2], sync=True)  # its idle interval, not the pace, decides
    assert paced.done() and recorder.batches == [([1, 2], True)]


async def test_paced_writes_made_during_a_flush_wait_for_the_pace() -> None:
    """Not taken along by the group commit loop: that would make one flush per commit."""
    recorder = Recorder()
    recorder.gate = asyncio.Event()
    buffer = WriteBuffer(recorder.flush, 3600, 1000, 0.001)
    buffer.pace(3600)
    first = buffer.add([1], sync=True)
    await recorder.entered.wait()
    paced = buffer.add([2], sync=False)
    recorder.gate.set()
    await first
    await _turns()
    assert recorder.batches == [([1], True)] and not paced.done()
    await buffer.drain()
    assert recorder.batches == [([1], True), ([2], False)]
