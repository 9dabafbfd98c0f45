"""The asyncio shell: three nodes in one process over an in-memory transport, each with its
write-ahead log in a real directory; a node is dropped (as a crash) and restarted from its
log."""

import asyncio
from pathlib import Path

import pytest

from broker.raft.core import LEADER, NotLeader
from broker.raft.messages import NORMAL, Entry
from broker.raft.node import RaftNode
from broker.raft.ready import SnapshotChunk

NODES = ("a", "b", "c")
GROUPS = (1, 2)


class Network:
    """Delivers a frame on a later loop turn, like a socket would; a node not in `nodes`
    (dropped) receives nothing."""

    def __init__(self) -> None:
        self.nodes: dict[str, RaftNode] = {}

    def transport(self, source: str) -> "Link":
        return Link(self, source)


class Link:
    def __init__(self, network: Network, source: str) -> None:
        self.network = network
        self.source = source

    def send(self, peer: str, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        loop.call_soon(self._deliver, peer, data)

    def flush(self) -> None:
        """Each message is on its way once sent."""

    def _deliver(self, peer: str, data: bytes) -> None:
        node = self.network.nodes.get(peer)
        if node is not None and self.source in self.network.nodes:
            node.receive(self.source, data)


class Commands:
    """A state machine that keeps the commands it applied, in memory only (so a restart
    applies the log again from the start)."""

    def __init__(self) -> None:
        self.applied: list[bytes] = []

    def apply(self, entry: Entry) -> None:
        if entry.kind == NORMAL:
            self.applied.append(entry.data)

    def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool]:
        raise AssertionError("no compaction in this test")

    def install_chunk(self, chunk: SnapshotChunk) -> None:
        raise AssertionError("no compaction in this test")


def _start(network: Network, node: str, root: Path) -> dict[int, Commands]:
    raft = RaftNode(node, str(root / node), network.transport(node), tick_seconds=0.01,
                    seed=ord(node))
    network.nodes[node] = raft
    machines = {group: Commands() for group in GROUPS}
    for group, machine in machines.items():
        raft.add_group(group, machine, voters=frozenset(NODES))
    return machines


async def _leader(network: Network, group: int) -> RaftNode:
    def elected() -> bool:
        return any(n.core(group).role == LEADER for n in network.nodes.values())
    await asyncio.wait_for(asyncio.gather(*(
        n.wait(elected) for n in network.nodes.values())), 10)
    return next(n for n in network.nodes.values() if n.core(group).role == LEADER)


async def test_three_nodes_commit_and_a_dropped_leader_recovers_from_its_log(
        tmp_path: Path) -> None:
    network = Network()
    machines = {node: _start(network, node, tmp_path) for node in NODES}
    try:
        leader = await _leader(network, 1)
        indexes = await asyncio.gather(*(
            leader.propose(1, b"one-%d" % i) for i in range(100)))
        assert len(set(indexes)) == 100
        assert machines[leader.id][1].applied == [b"one-%d" % i for i in range(100)]
        await leader.read_index(1)
        follower = next(n for n in network.nodes.values() if n is not leader)
        with pytest.raises(NotLeader):
            await follower.propose(1, b"refused")
        # Every entry written by all groups on a node went through few fsyncs.
        assert leader.wal.entries_written / leader.wal.syncs > 1

        # Drop the leader as a crash would; the other two elect one and go on.
        await leader.close()
        del network.nodes[leader.id]
        second = await _leader(network, 1)
        await asyncio.gather(*(second.propose(1, b"two-%d" % i) for i in range(50)))

        # Restarted from its write-ahead log, it catches up with the same history.
        machines[leader.id] = _start(network, leader.id, tmp_path)
        restarted = network.nodes[leader.id]
        assert restarted.core(1).log.last_index >= 100
        expected = machines[second.id][1].applied
        await asyncio.wait_for(restarted.wait(
            lambda: machines[leader.id][1].applied == expected), 10)
        assert len(expected) == 150
        metrics = {name for name, _, _, _, _ in restarted.metrics()}
        assert {"raft_wal_fsyncs", "raft_commit_index", "raft_role"} <= metrics
    finally:
        for node in list(network.nodes.values()):
            await node.close()


async def test_garbled_and_unknown_group_frames_are_dropped_and_counted(
        tmp_path: Path) -> None:
    network = Network()
    _start(network, "a", tmp_path)
    node = network.nodes["a"]
    try:
        node.receive("b", b"\x01\x00")
        node.receive("b", b"\x63" + bytes(20))
        node.receive("b", b"\x03\x00\x00\x00\x63" + bytes(24))  # a heartbeat for group 99
        assert node.host.dropped_malformed == 2
        assert node.host.dropped_unknown_group == 1
    finally:
        await node.close()


async def test_hand_over_moves_every_led_group_to_a_peer_the_predicate_allows(
        tmp_path: Path) -> None:
    network = Network()
    for node in NODES:
        _start(network, node, tmp_path)
    try:
        leader = await _leader(network, 1)
        await leader.propose(1, b"before")
        refused, allowed = sorted(n for n in NODES if n != leader.id)
        leader.host.can_transfer_to = lambda peer: peer != refused
        led = leader.led()
        assert 1 in led
        assert await leader.hand_over(10) == (led, [])
        assert leader.led() == []
        for group in led:
            new = network.nodes[allowed].core(group)
            assert new.role == LEADER and new.transfer_elections == 1
        # Nobody it may hand to: it keeps leading, and says so at once.
        new_leader = network.nodes[allowed]
        new_leader.host.can_transfer_to = lambda peer: False
        assert await new_leader.hand_over(10) == ([], led)
        await new_leader.propose(1, b"after")
    finally:
        for node in list(network.nodes.values()):
            await node.close()
