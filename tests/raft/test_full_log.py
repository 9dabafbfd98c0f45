"""A follower whose write-ahead log has no space (its directory on a 1 MiB tmpfs of its own,
filled up): it acknowledges nothing it could not write, so the group commits with the two
others and the full one's log does not count; it grants no vote (a vote must be on disk
first), so with the leader gone the other follower cannot be elected while it is full; once
space is back its log is written again by itself, a leader is elected and it applies every
command. Three RaftNodes in one process over the in-memory transport of test_node.py."""

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.raft.core import LEADER, PRE_CANDIDATE, NotLeader
from broker.raft.node import CommandLost, RaftNode
from tests.raft.test_node import Commands, Network
from tests.support.full_disk import fill, tmpfs

GROUP = 1
NODES = ("a", "b", "c")
COMMANDS = 50


def _command(i: int) -> bytes:
    return b"%08d" % i * 128  # 1 KiB: the log needs pages the volume does not have


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "volume", 1) as mounted:
        yield mounted


def _start(network: Network, node: str, directory: Path) -> Commands:
    raft = RaftNode(node, str(directory), network.transport(node), tick_seconds=0.01,
                    seed=ord(node))
    network.nodes[node] = raft
    machine = Commands()
    raft.add_group(GROUP, machine, voters=frozenset(NODES))
    return machine


def _leader(network: Network) -> RaftNode | None:
    return next((n for n in network.nodes.values() if n.core(GROUP).role == LEADER), None)


async def test_a_follower_without_space_neither_acknowledges_nor_votes(
        tmp_path: Path, volume: Path) -> None:
    network = Network()
    machines = {node: _start(network, node, tmp_path / node) for node in ("a", "b")}
    try:
        await asyncio.wait_for(network.nodes["a"].wait(lambda: _leader(network) is not None), 10)
        leader = _leader(network)
        assert leader is not None
        machines["c"] = _start(network, "c", volume / "wal")
        full = network.nodes["c"]
        disk: list[BaseException | None] = []
        full.on_disk = disk.append
        await leader.propose(GROUP, b"before")
        await asyncio.wait_for(full.wait(lambda: machines["c"].applied == [b"before"]), 10)
        filler = fill(volume, 0)
        # The two others commit throughout; the follower's log fills (what is left of a
        # page takes a few commands first).
        sent = 0
        while not disk:
            await asyncio.wait_for(leader.propose(GROUP, _command(sent)), 10)
            sent += 1
        assert disk[0] is not None
        acknowledged = leader.core(GROUP).progress["c"].match
        assert acknowledged <= full.core(GROUP).persisted_index
        applied = list(machines["c"].applied)
        for i in range(sent, COMMANDS):
            await asyncio.wait_for(leader.propose(GROUP, _command(i)), 10)
        # The full follower acknowledged none of those, and applied none.
        assert leader.core(GROUP).progress["c"].match == acknowledged
        assert machines["c"].applied == applied

        # The leader goes: the other follower needs the full one's vote, which it cannot
        # give (a grant waits for the disk), nor can the full one count its own; the
        # election times out and a pre-vote starts over, and no one leads.
        other = next(n for name, n in network.nodes.items() if n is not leader and name != "c")
        del network.nodes[leader.id]
        await leader.close()
        started = other.core(GROUP).elections
        await asyncio.wait_for(other.wait(lambda: other.core(GROUP).elections > started), 10)
        await asyncio.wait_for(other.wait(lambda: other.core(GROUP).role == PRE_CANDIDATE), 10)
        assert _leader(network) is None

        # Space is back: the log is written by itself, a leader is elected, all applied.
        filler.unlink()
        await asyncio.wait_for(full.wait(lambda: _leader(network) is not None), 10)
        assert disk[-1] is None
        everything = [b"before", *(_command(i) for i in range(COMMANDS))]
        await asyncio.wait_for(full.wait(lambda: machines["c"].applied == everything), 10)
    finally:
        for node in list(network.nodes.values()):
            await node.close()


async def test_a_leader_without_space_hands_its_leadership_over(
        tmp_path: Path, volume: Path) -> None:
    """A leader whose log fills still hears its followers (heartbeats need no disk), so no
    election would ever replace it; it cannot apply, so nothing it leads would be
    acknowledged. It hands the group to a voter that can write, and catches up once space
    is back."""
    network = Network()
    machines = {node: _start(network, node, tmp_path / node) for node in ("a", "b")}
    machines["c"] = _start(network, "c", volume / "wal")
    full = network.nodes["c"]
    try:
        await asyncio.wait_for(full.wait(lambda: _leader(network) is not None), 10)
        leader = _leader(network)
        assert leader is not None
        if leader is not full:  # the full node leads first
            await asyncio.wait_for(leader.propose(GROUP, b"before"), 10)
            leader.core(GROUP).transfer_leadership("c")
            await asyncio.wait_for(full.wait(lambda: full.core(GROUP).role == LEADER), 10)
        await asyncio.wait_for(full.propose(GROUP, b"led by c"), 10)
        filler = fill(volume, 0)
        sent = 0
        async with asyncio.timeout(30):
            while _leader(network) in (None, full):
                with contextlib.suppress(NotLeader, CommandLost, TimeoutError):
                    await asyncio.wait_for(full.propose(GROUP, _command(sent)), 1)
                sent += 1
        assert full.core(GROUP).transfers >= 1  # handed over, not voted out
        successor = _leader(network)
        assert successor is not None and successor is not full
        await asyncio.wait_for(successor.propose(GROUP, b"after"), 10)
        assert full.core(GROUP).role != LEADER

        filler.unlink()
        await asyncio.wait_for(full.wait(lambda: b"after" in machines["c"].applied), 10)
        assert machines["c"].applied == machines[successor.id].applied
    finally:
        for node in list(network.nodes.values()):
            await node.close()
