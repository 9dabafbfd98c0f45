"""The proposer: commands in order, batched while one batch is in flight, retried until
committed, failed after the commit timeout."""

import asyncio

import pytest

from broker.cluster.proposer import Batch, CommitTimeout, Proposer
from broker.retainer.machine import decode_commands
from broker.retainer.store import encode_record
from broker.session.message import Message


def _command(text: str) -> bytes:
    return encode_record(Message("t", text.encode(), retain=True))


def _payloads(data: bytes) -> list[bytes]:
    return [message.payload for message, _ in decode_commands(data)]


async def test_commands_queued_during_a_commit_form_the_next_batch_in_order() -> None:
    batches: list[list[bytes]] = []
    gate = asyncio.Event()

    async def submit(batch: Batch, data: bytes) -> None:
        batches.append(_payloads(data))
        await gate.wait()

    proposer = Proposer(submit, 10.0)
    proposer.start()
    try:
        first = proposer.add(_command("1")).future
        await asyncio.sleep(0)  # the first batch is in flight
        rest = [proposer.add(_command(str(n))).future for n in range(2, 6)]
        gate.set()
        await asyncio.gather(first, *rest)
        assert batches == [[b"1"], [b"2", b"3", b"4", b"5"]]
        assert len(set(rest)) == 1  # one future per batch
        assert (proposer.batches, proposer.commands) == (2, 5)
    finally:
        await proposer.stop()


async def test_a_batch_not_committed_in_time_fails_and_the_next_goes_on() -> None:
    attempts: list[list[bytes]] = []

    async def submit(batch: Batch, data: bytes) -> None:
        attempts.append(_payloads(data))
        if attempts[-1] == [b"stuck"]:
            await asyncio.Event().wait()  # no leader, ever

    proposer = Proposer(submit, 0.05)
    proposer.start()
    try:
        stuck = proposer.add(_command("stuck")).future
        with pytest.raises(CommitTimeout):
            await stuck
        await proposer.add(_command("later")).future
        assert attempts == [[b"stuck"], [b"later"]] and proposer.timed_out == 1
    finally:
        await proposer.stop()


async def test_abandon_cancels_what_waits() -> None:
    async def submit(batch: Batch, data: bytes) -> None:
        await asyncio.Event().wait()

    proposer = Proposer(submit, 10.0)
    proposer.start()
    waiting = [proposer.add(_command("a")).future, proposer.add(_command("b")).future]
    await asyncio.sleep(0)
    waiting.append(proposer.add(_command("c")).future)  # queued behind the batch in flight
    await proposer.stop()
    assert not any(future.done() for future in waiting)  # a shutdown leaves them
    proposer.abandon()
    assert waiting[0] is waiting[1] is not waiting[2]
    assert all(future.cancelled() for future in waiting)
