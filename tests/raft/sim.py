"""Deterministic simulation of Raft nodes: seeded network, disk and crash faults, with Raft's
safety properties checked as it runs.

Every node is the real `RaftHost` (the groups' cores, their shared write-ahead log, the
after-persist hold-back) over a `MemoryStore` disk that keeps only what was fsync'd when a
node crashes, plus a random prefix of the rest (a torn write); a restart recovers through
the real `WriteAheadLog.recover`. The network loses, duplicates, delays (so reorders) and
partitions messages, and drops links: both ends of a connection see it close (`peer_lost`), as
the peers of a killed node see its connections close (most crashes; the rest fall silent, as
a frozen node does). One seed fixes everything: a failure prints its seed, and
`python -m tests.raft.sim --seed N` replays it.

Checked while it runs: election safety (one leader per term), "same index and term, same
entry", log matching (pairwise, periodically and at the end), leader completeness (a new
leader holds every committed entry), state-machine safety (every node applies the same
command at an index, down to a digest of the whole applied history), durability (what a
node had on disk before a crash is there after it; an acknowledged proposal is never
lost), linearizable read-index reads, and at the end liveness (after the faults heal, every
group elects a leader and commits).

Leaders hand their leadership over now and then (to a random voter: one that lags, is cut
off or down; or to the one RaftHost chooses), while proposals go on, and sometimes the
leader or the target crashes mid-transfer; the same checks hold.

A received snapshot chunk's storage fails now and then (a full disk): the follower keeps the
state it had, acknowledges nothing of that transfer, and the leader starts it over. Half the
installs go on off the loop for a while (a shard builds its database on a thread): the group
goes on receiving meanwhile, its chunk unanswered and its committed entries held. Now and
then the receiving machine asks for the transfer to go on from an earlier offset (a shipped
file failed its checksum: broker/ds/shipped.py), and some groups' leaders send a new replica
(an empty log) the snapshot rather than the log, as a shard with sealed generations does.
A snapshot can be made longer than the leader's window of chunks in flight (`snapshot_chunks`),
so that the window refills as answers come, several per flush.
"""

import argparse
import errno
import functools
import hashlib
import heapq
import os
import random
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.raft.core import LEADER, ConfigChangeRefused, NotLeader, RaftGroup, TransferRefused
from broker.raft.host import ApplyFailed, HostBatch, PendingInstall, RaftHost
from broker.raft.messages import Entry
from broker.raft.ready import SnapshotChunk, SnapshotMeta
from broker.raft.wal import WalBatch, WriteAheadLog


class SafetyViolation(AssertionError):
    pass


class MemoryStore:
    """Segments in memory; `crash` keeps the synced bytes and a random prefix of the rest."""

    def __init__(self) -> None:
        self.durable: dict[str, bytearray] = {}
        self.written: dict[str, bytearray] = {}
        self.current = ""

    def names(self) -> list[str]:
        return sorted(self.durable)

    def read(self, name: str) -> bytes:
        return bytes(self.durable[name] + self.written[name])

    def create(self, name: str) -> None:
        self.durable[name] = bytearray()
        self.written[name] = bytearray()
        self.current = name

    def write(self, data: bytes) -> None:
        self.written[self.current] += data

    def sync(self) -> None:
        if self.current:
            self.durable[self.current] += self.written[self.current]
            self.written[self.current].clear()

    def truncate(self, name: str, size: int) -> None:
        data = self.durable[name] + self.written[name]
        self.durable[name] = data[:size]
        self.written[name] = bytearray()

    def delete(self, name: str) -> None:
        del self.durable[name]
        del self.written[name]

    def close(self) -> None:
        pass

    def crash(self, rng: random.Random, torn: bool) -> None:
        for name, pending in self.written.items():
            if torn and pending and rng.random() < 0.5:
                self.durable[name] += pending[:rng.randrange(len(pending) + 1)]
            pending.clear()
        self.current = ""


def _digest(previous: bytes, entry: Entry) -> bytes:
    return hashlib.blake2b(b"%b%d%d%b" % (previous, entry.term, entry.kind, entry.data),
                           digest_size=8).digest()


class Checker:
    def __init__(self) -> None:
        self.leaders: dict[tuple[int, int], str] = {}
        self.digests: dict[int, dict[int, bytes]] = {}  # group -> index -> digest
        self.entries: dict[int, dict[tuple[int, int], bytes]] = {}  # (index, term) -> data
        self.committed: dict[int, dict[int, int]] = {}  # group -> index -> term
        self.max_committed: dict[int, int] = {}
        self.acked: dict[int, int] = {}  # group -> highest acknowledged index
        self.acks = 0
        self.reads = 0
        self.installs = 0

    def fail(self, message: str) -> None:
        raise SafetyViolation(message)

    def on_leader(self, group: int, term: int, node: str, core: RaftGroup) -> None:
        known = self.leaders.setdefault((group, term), node)
        if known != node:
            self.fail(f"group {group} term {term}: two leaders, {known} and {node}")
        # Leader completeness: every entry committed so far is in its log.
        log = core.log
        top = self.max_committed.get(group, 0)
        if top > log.last_index:
            self.fail(f"group {group}: leader {node} (term {term}) ends at {log.last_index}, "
                      f"before committed index {top}")
        committed = self.committed.get(group, {})
        for index in range(log.snapshot_index + 1, top + 1):
            if log.term_at(index) != committed.get(index, log.term_at(index)):
                self.fail(f"group {group}: leader {node} (term {term}) lacks committed entry "
                          f"{index}")

    def on_commit(self, group: int, core: RaftGroup, previous: int) -> None:
        """A leader's commit index moved from `previous`."""
        committed = self.committed.setdefault(group, {})
        log = core.log
        for index in range(max(previous, log.snapshot_index) + 1, core.commit + 1):
            term = log.term_at(index)
            assert term is not None
            if committed.setdefault(index, term) != term:
                self.fail(f"group {group}: index {index} committed with terms "
                          f"{committed[index]} and {term}")
        if core.commit > self.max_committed.get(group, 0):
            self.max_committed[group] = core.commit

    def on_append(self, group: int, node: str, entries: list[Entry]) -> None:
        known = self.entries.setdefault(group, {})
        for entry in entries:
            data = known.setdefault((entry.index, entry.term), entry.data)
            if data != entry.data:
                self.fail(f"group {group}: {node} has entry {entry.index} of term {entry.term} "
                          "differing from another node's")

    def on_apply(self, group: int, node: str, index: int, digest: bytes) -> None:
        known = self.digests.setdefault(group, {}).setdefault(index, digest)
        if known != digest:
            self.fail(f"group {group}: {node} applied a different history at index {index}")

    def expected_digest(self, group: int, index: int) -> bytes | None:
        return self.digests.get(group, {}).get(index)


class CheckedWal(WriteAheadLog):
    """Checks every entry written: one index and term, one entry, on every node."""

    def __init__(self, checker: Checker, node: str, store: MemoryStore) -> None:
        super().__init__(store, segment_bytes=4096)
        self.checker = checker
        self.node = node

    def entries(self, group: int, entries: list[Entry]) -> None:
        self.checker.on_append(group, self.node, entries)
        super().entries(group, entries)


class SimMachine:
    """A state machine whose state is a digest of everything applied (so comparing digests
    compares whole histories). Its data is "flushed" when the simulation says so; a crash
    takes it back to the flushed state."""

    CHUNK = 48

    def __init__(self, group: int, node: str, checker: Checker,
                 storage_fails: Callable[[], bool],
                 rewind: Callable[[int], int | None],
                 defer: Callable[[], Callable[[Callable[[], object]], None] | None],
                 chunks: int = 3) -> None:
        self.group = group
        # Copies of the digest that pad a snapshot to `chunks` chunks.
        self.padding = (self.CHUNK * chunks - 16) // 8
        self.node = node
        self.checker = checker
        self.storage_fails = storage_fails
        self.rewind = rewind
        # Whether an install goes on off the loop: how its work is started (None: not).
        self.defer = defer
        self.deferred = 0
        self.storage_failures = 0
        self.rewinds = 0
        self.index = 0
        self.digest = b"\0" * 8
        self.flushed = (0, self.digest)
        self.installed: SnapshotMeta | None = None
        self.snapshots: dict[int, bytes] = {}
        self._receiving = bytearray()

    def apply(self, entry: Entry) -> None:
        if entry.index != self.index + 1:
            self.checker.fail(f"group {self.group}: {self.node} applied {entry.index} after "
                              f"{self.index}")
        self.index = entry.index
        self.digest = _digest(self.digest, entry)
        self.checker.on_apply(self.group, self.node, self.index, self.digest)

    def flush(self) -> int:
        """Flushes; the log may be compacted up to the result (not past a snapshot being
        sent, as a shard keeps the entries after its spooled one)."""
        self.flushed = (self.index, self.digest)
        return min([self.index, *self.snapshots])

    def crash(self) -> None:
        self.index, self.digest = self.flushed
        self.snapshots.clear()
        self._receiving.clear()

    def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool] | None:
        if index == 0 and self.snapshots:
            index = next(iter(self.snapshots))
        payload = self.snapshots.get(index)
        if payload is None:
            # Prepared now and served from the next request on, as a shard dumps its
            # snapshot on a worker thread. Padding makes it several chunks long.
            self.snapshots = {
                self.index: struct.pack(">Q", self.index) + self.digest
                + self.digest * self.padding}
            return None
        chunk = payload[offset:offset + self.CHUNK]
        done = offset + len(chunk) >= len(payload)
        if done:
            self.snapshots = {}
        return index, chunk, done

    def install_chunk(self, chunk: SnapshotChunk) -> int | PendingInstall | None:
        if self.storage_fails():  # what came of the transfer is dropped, the state kept
            self._fail(chunk)
        if chunk.offset == 0:
            self._receiving.clear()
        if chunk.offset != len(self._receiving):
            self.checker.fail(f"{self.node}: snapshot chunk at {chunk.offset}, expected "
                              f"{len(self._receiving)}")
        self._receiving += chunk.data
        back = self.rewind(len(self._receiving))
        if back is not None:  # as a shipped file that failed its checksum: fetched again
            self.rewinds += 1
            del self._receiving[back:]
            return back
        if not chunk.done:
            return None
        received = bytes(self._receiving)
        self._receiving.clear()
        start = self.defer()
        if start is None:
            self._install(chunk, received)
            return None
        # As a shard builds its database on a thread: the state stays as it was until the
        # shell finishes the install, which may still fail then (the transfer starts over).
        self.deferred += 1

        def finish() -> None:
            if self.storage_fails():
                self._fail(chunk)
            self._install(chunk, received)

        return PendingInstall(start, finish)

    def _fail(self, chunk: SnapshotChunk) -> None:
        self._receiving.clear()
        self.storage_failures += 1
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise ApplyFailed(f"{self.node}: snapshot chunk at {chunk.offset}: no space", full)

    def _install(self, chunk: SnapshotChunk, received: bytes) -> None:
        (index,) = struct.unpack_from(">Q", received)
        digest = received[8:16]
        if index != chunk.index or received[16:] != digest * self.padding:
            self.checker.fail(f"{self.node}: garbled snapshot at {chunk.index}")
        expected = self.checker.expected_digest(self.group, index)
        if expected != digest:
            self.checker.fail(f"group {self.group}: {self.node} installed a snapshot at {index} "
                              "that no node applied")
        self.index, self.digest = index, digest
        self.flushed = (index, digest)  # an installed snapshot is durable before the log
        self.installed = SnapshotMeta(index, chunk.term, chunk.config)
        self.checker.installs += 1


@dataclass
class Options:
    nodes: int = 5
    groups: int = 3
    steps: int = 20000
    loss: float = 0.05
    duplicate: float = 0.02
    max_delay: float = 2.0
    crash_every: float = 30.0  # mean simulated time (ticks) between crashes
    partition_every: float = 80.0
    change_every: float = 30.0
    propose_every: float = 0.5
    compact_every: float = 40.0
    read_every: float = 5.0
    transfer_every: float = 20.0
    link_drop_every: float = 25.0  # a connection closes (both ends see it) and is redialled
    crash_closes_links: float = 0.7  # share of crashes whose peers see the links close
    crash_in_transfer: float = 0.2  # share of transfers during which the leader or target crashes
    check_every: int = 200  # steps between pairwise log-matching checks
    torn_writes: bool = True
    disk_stalls: float = 0.1  # share of fsyncs that take 2-8 ticks (wider crash windows)
    chunk_failures: float = 0.1  # share of received snapshot chunks whose storage fails
    chunk_rewinds: float = 0.05  # share after which the machine resumes at an earlier offset
    snapshot_new_replicas: float = 0.5  # share of groups that snapshot an empty follower
    deferred_installs: float = 0.5  # share of installs that run off the loop, 0.5-6 ticks
    snapshot_chunks: int = 3  # a snapshot's length in chunks (SNAPSHOT_WINDOW: 4 in flight)


@dataclass(order=True)
class _Event:
    time: float
    seq: int
    action: Callable[[], object] = field(compare=False)


class Simulation:
    def __init__(self, seed: int, options: Options | None = None) -> None:
        self.seed = seed
        self.options = options or Options()
        self.rng = random.Random(seed)
        self.checker = Checker()
        self.now = 0.0
        self.steps = 0
        self._seq = 0
        self._events: list[_Event] = []
        self.ids = [f"n{i}" for i in range(1, self.options.nodes + 1)]
        self.nodes = {node: SimNode(self, node) for node in self.ids}
        self.blocked: set[tuple[str, str]] = set()
        # Dropped links, until redialled: (a, b) and (b, a) -> the drop's number.
        self.cut: dict[tuple[str, str], int] = {}
        # How many times each pair's connection closed: what was in flight on a closed one
        # is lost (TCP delivers nothing after the close its receiver saw).
        self.closes: dict[frozenset[str], int] = {}
        self.initial: dict[int, frozenset[str]] = {}
        for group in range(1, self.options.groups + 1):
            self.initial[group] = frozenset(self.rng.sample(self.ids, 3))
        self.snapshot_new = {group: self.rng.random() < self.options.snapshot_new_replicas
                             for group in self.initial}
        for node in self.nodes.values():
            node.start()
        self.proposed = 0
        self.crashes = 0
        self.partitions = 0
        self.changes = 0
        self.link_drops = 0
        self.transfers: list[tuple[int, int, str]] = []  # (group, term, target) started
        self.faults = True
        self._schedule_faults()

    # ----------------------------------------------------------------- engine

    def at(self, delay: float, action: Callable[[], object]) -> None:
        self._seq += 1
        heapq.heappush(self._events, _Event(self.now + delay, self._seq, action))

    def run(self) -> None:
        options = self.options
        while self.steps < options.steps:
            self.step()
        self.finish()

    def step(self) -> None:
        event = heapq.heappop(self._events)
        self.now = event.time
        event.action()
        self.steps += 1
        if self.steps % self.options.check_every == 0:
            self.check_logs()

    def send(self, source: str, target: str, data: bytes) -> None:
        rng = self.rng
        options = self.options
        if self.faults and rng.random() < options.loss:
            return
        copies = 2 if self.faults and rng.random() < options.duplicate else 1
        link = frozenset((source, target))
        closes = self.closes.get(link, 0)
        for _ in range(copies):
            delay = 0.05 + rng.random() * (options.max_delay if self.faults else 0.3)
            self.at(delay, lambda: self.deliver(source, target, data, closes))

    def deliver(self, source: str, target: str, data: bytes, closes: int = 0) -> None:
        node = self.nodes[target]
        if node.alive and (source, target) not in self.blocked and (
                source, target) not in self.cut and closes == self.closes.get(
                frozenset((source, target)), 0):
            if self.faults and self.rng.random() < 0.001:
                data = data[:self.rng.randrange(len(data))]  # garbled: must be dropped
            node.host.receive(source, data)
            node.flush()

    # ----------------------------------------------------------------- faults

    def _schedule_faults(self) -> None:
        options = self.options
        self._every(options.crash_every, self.crash_someone)
        self._every(options.partition_every, self.partition)
        self._every(options.change_every, self.change_membership)
        self._every(options.propose_every, self.propose)
        self._every(options.compact_every, self.compact)
        self._every(options.read_every, self.read)
        self._every(options.transfer_every, self.transfer)
        self._every(options.link_drop_every, self.drop_link)

    def _every(self, mean: float, action: Callable[[], None]) -> None:
        def fire() -> None:
            if self.faults or action in (self.propose, self.read, self.compact):
                action()
            self.at(self.rng.expovariate(1 / mean), fire)
        self.at(self.rng.expovariate(1 / mean), fire)

    def crash_someone(self) -> None:
        # Half the time a node with an fsync under way: the window that durability bugs
        # (acknowledging or counting what is not on disk yet) need.
        syncing = [n for n in self.ids if self.nodes[n].alive and self.nodes[n].syncing]
        if syncing and self.rng.random() < 0.5:
            node = self.nodes[self.rng.choice(syncing)]
        else:
            node = self.nodes[self.rng.choice(self.ids)]
        self._crash(node)

    def _crash(self, node: "SimNode", closes_links: bool | None = None) -> None:
        """`closes_links`: whether its peers see its connections close (a killed process)
        or it just falls silent (a frozen one, a power cut); None: at random."""
        if not node.alive:
            return
        self.crashes += 1
        node.crash()
        if closes_links is None:
            closes_links = self.rng.random() < self.options.crash_closes_links
        if closes_links:
            for peer in self.ids:
                if peer != node.id:
                    self._see_closed(peer, node.id)
        self.at(5 + self.rng.random() * 40, node.start)

    def _see_closed(self, node: str, peer: str) -> None:
        """`node` sees its connection to `peer` close, a moment later."""
        link = frozenset((node, peer))
        self.closes[link] = self.closes.get(link, 0) + 1
        self.at(0.01 + self.rng.random() * 0.1, lambda: self.nodes[node].peer_lost(peer))

    def drop_link(self, pair: tuple[str, str] | None = None, down_for: float | None = None,
                  ) -> None:
        """A connection closes (a reset, a proxy, a flap) and is dialled again: both ends
        see it close, nothing passes meanwhile, and both are told it is back."""
        a, b = pair or self.rng.sample(self.ids, 2)
        self.link_drops += 1
        drop = self.link_drops
        self.cut[a, b] = self.cut[b, a] = drop
        self._see_closed(a, b)
        self._see_closed(b, a)

        def redialled() -> None:
            if self.cut.get((a, b)) != drop:
                return  # dropped again since: that drop redials it
            del self.cut[a, b], self.cut[b, a]
            for node, peer in ((a, b), (b, a)):
                self.nodes[node].unreachable(peer)
        self.at(down_for if down_for is not None else 0.5 + self.rng.random() * 3, redialled)

    def partition(self) -> None:
        self.partitions += 1
        side = set(self.rng.sample(self.ids, self.rng.randrange(1, len(self.ids))))
        self.blocked = {(a, b) for a in self.ids for b in self.ids
                        if (a in side) != (b in side)}
        if self.rng.random() < 0.3:  # one direction only
            self.blocked = {(a, b) for a, b in self.blocked if a in side}
        self.at(10 + self.rng.random() * 60, self.heal)

    def heal(self) -> None:
        self.blocked = set()

    def run_until(self, condition: Callable[[], bool], ticks: float) -> bool:
        """Steps until `condition()` holds (True) or `ticks` of simulated time passed."""
        deadline = self.now + ticks
        while self.now < deadline:
            if condition():
                return True
            self.step()
        return condition()

    def leader_of(self, group: int) -> "SimNode | None":
        leaders = [node for node in self.nodes.values()
                   if node.alive and node.host.core(group).role == LEADER]
        return self.rng.choice(leaders) if leaders else None

    def change_membership(self) -> None:
        group = self.rng.randrange(1, self.options.groups + 1)
        node = self.leader_of(group)
        if node is None:
            return
        core = node.host.core(group)
        config = core.log.config
        outsiders = [n for n in self.ids if n not in config.members()]
        choice = self.rng.random()
        try:
            if config.learners and choice < 0.5:
                core.promote(self.rng.choice(sorted(config.learners)))
            elif outsiders and len(config.voters) < 5 and choice < 0.75:
                core.add_learner(self.rng.choice(outsiders))
            elif len(config.voters) > 3 or config.learners:
                candidates = sorted(config.learners or config.voters)
                core.remove(self.rng.choice(candidates))
            else:
                return
        except ConfigChangeRefused:
            return
        self.changes += 1
        node.flush()

    def transfer(self) -> None:
        group = self.rng.randrange(1, self.options.groups + 1)
        node = self.leader_of(group)
        if node is None:
            return
        core = node.host.core(group)
        if self.rng.random() < 0.5:
            target = node.host.transfer_leadership(group)
            if target is None:
                return
        else:
            target = self.rng.choice(sorted(core.log.config.members()))
            try:
                core.transfer_leadership(target)
            except TransferRefused:
                return  # itself, or a learner
        self.transfers.append((group, core.term, target))
        node.flush()
        if self.faults and self.rng.random() < self.options.crash_in_transfer:
            victim = self.nodes[self.rng.choice([node.id, target])]
            self.at(self.rng.random() * 3, lambda: self._crash(victim))

    def transfers_done(self) -> int:
        """Transfers whose target led the next term (an election may have made it so, too)."""
        return sum(1 for group, term, target in self.transfers
                   if self.checker.leaders.get((group, term + 1)) == target)

    def chunk_failures(self) -> int:
        return sum(machine.storage_failures for node in self.nodes.values()
                   for machine in node.machines.values())

    def chunk_rewinds(self) -> int:
        return sum(machine.rewinds for node in self.nodes.values()
                   for machine in node.machines.values())

    def deferred_installs(self) -> int:
        return sum(machine.deferred for node in self.nodes.values()
                   for machine in node.machines.values())

    def transfers_aborted(self) -> int:
        return sum(node.transfers_aborted + sum(
            node.host.core(group).transfers_aborted for group in node.machines)
            for node in self.nodes.values())

    def propose(self) -> None:
        group = self.rng.randrange(1, self.options.groups + 1)
        node = self.nodes[self.rng.choice(self.ids)]
        if not node.alive:
            return
        self.proposed += 1
        data = b"g%d-c%d" % (group, self.proposed)

        slot: list[int] = []

        def done(ok: bool) -> None:
            if ok:
                self.checker.acks += 1
                self.checker.acked[group] = max(self.checker.acked.get(group, 0), slot[0])

        try:
            slot.append(node.host.propose(group, data, done))
        except NotLeader:
            return
        node.flush()

    def read(self) -> None:
        group = self.rng.randrange(1, self.options.groups + 1)
        node = self.leader_of(group)
        if node is None:
            return
        must_see = self.checker.acked.get(group, 0)
        machine = node.machines[group]
        incarnation = node.incarnation

        def done(ok: bool) -> None:
            if ok and node.incarnation == incarnation:
                self.checker.reads += 1
                if machine.index < must_see:
                    self.checker.fail(f"group {group}: read on {node.id} at {machine.index} "
                                      f"misses acknowledged index {must_see}")

        node.host.read_index(group, done)
        node.flush()

    def compact(self) -> None:
        node = self.nodes[self.rng.choice(self.ids)]
        if not node.alive:
            return
        for group, machine in node.machines.items():
            if self.rng.random() < 0.5:
                node.host.compact(group, machine.flush() - self.rng.randrange(5))
        node.flush()

    # ----------------------------------------------------------------- checks

    def check_logs(self) -> None:
        """Log matching, pairwise: logs agreeing on an entry agree on all before it."""
        live = [node for node in self.nodes.values() if node.alive]
        for group in self.initial:
            for i, a in enumerate(live):
                for b in live[i + 1:]:
                    _check_pair(self.checker, group, a, b)

    def finish(self) -> None:
        """Heals everything, restarts the dead, and requires every group to make progress."""
        self.faults = False
        self.blocked = set()
        self.cut = {}
        for node in self.nodes.values():
            if not node.alive:
                node.start()
        deadline = self.now + 400
        acked_before = {group: self.checker.acked.get(group, 0) for group in self.initial}
        while self.now < deadline:
            self.step()
            if all(self.checker.acked.get(group, 0) > acked_before[group]
                   and self._converged(group) for group in self.initial):
                break
        else:
            stuck = [group for group in self.initial
                     if self.checker.acked.get(group, 0) <= acked_before[group]
                     or not self._converged(group)]
            self.checker.fail(f"groups {stuck} made no progress after the faults healed")
        self.check_logs()

    def _converged(self, group: int) -> bool:
        leader = self.leader_of(group)
        if leader is None:
            return False
        core = leader.host.core(group)
        voters = core.log.config.voters
        return all(self.nodes[v].machines[group].index >= self.checker.acked.get(group, 0)
                   for v in voters)


def _check_pair(checker: Checker, group: int, a: "SimNode", b: "SimNode") -> None:
    la, lb = a.host.core(group).log, b.host.core(group).log
    low = max(la.snapshot_index, lb.snapshot_index) + 1
    high = min(la.last_index, lb.last_index)
    agree = 0
    for index in range(high, low - 1, -1):
        if la.term_at(index) == lb.term_at(index):
            agree = index
            break
    for index in range(low, agree + 1):
        ea = la.entries[index - la.snapshot_index - 1]
        eb = lb.entries[index - lb.snapshot_index - 1]
        if ea.term != eb.term or ea.data != eb.data:
            checker.fail(f"group {group}: {a.id} and {b.id} agree at {agree} but differ at "
                         f"{index}")


class _NodeTransport:
    def __init__(self, sim: Simulation, node: str) -> None:
        self.sim = sim
        self.node = node

    def send(self, peer: str, data: bytes) -> None:
        self.sim.send(self.node, peer, data)

    def flush(self) -> None:
        """The simulated network delivers each message on its own."""


class SimNode:
    def __init__(self, sim: Simulation, node: str) -> None:
        self.sim = sim
        self.id = node
        self.store = MemoryStore()
        self.alive = False
        self.incarnation = 0
        def storage_fails() -> bool:
            return sim.faults and sim.rng.random() < sim.options.chunk_failures

        def rewind(received: int) -> int | None:
            if not sim.faults or sim.rng.random() >= sim.options.chunk_rewinds:
                return None
            return sim.rng.randrange(received + 1)

        def defer() -> Callable[[Callable[[], object]], None] | None:
            if not sim.faults or sim.rng.random() >= sim.options.deferred_installs:
                return None
            return lambda done: sim.at(0.5 + sim.rng.random() * 5.5, done)

        self.machines = {group: SimMachine(group, node, sim.checker, storage_fails, rewind,
                                           defer, sim.options.snapshot_chunks)
                         for group in range(1, sim.options.groups + 1)}
        self._written: list[tuple[HostBatch, WalBatch]] = []
        self.syncing = False
        self.transfers_aborted = 0  # by the cores of its earlier incarnations
        self._roles: dict[int, tuple[int, int]] = {}
        self._before_crash: dict[int, tuple[int, int, str | None, list[int]]] = {}

    def start(self) -> None:
        if self.alive:
            return
        sim = self.sim
        self.alive = True
        self.incarnation += 1
        self.wal = CheckedWal(sim.checker, self.id, self.store)
        recovered = self.wal.recover()
        self.host = RaftHost(self.id, self.wal, _NodeTransport(sim, self.id),
                             random.Random(sim.rng.random()), election_ticks=10,
                             heartbeat_ticks=2)
        for group, machine in self.machines.items():
            machine.crash()
            voters = sim.initial[group] if self.id in sim.initial[group] else frozenset()
            core = self.host.add_group(group, machine, recovered.get(group), voters,
                                       applied=machine.flushed[0], snapshot=machine.installed)
            core.snapshot_empty_followers = sim.snapshot_new[group]
            self._check_recovered(group, core)
        self._roles = {}
        incarnation = self.incarnation
        offset = sim.rng.random()

        def tick() -> None:
            if self.incarnation == incarnation and self.alive:
                self.host.tick()
                self.flush()
                sim.at(1.0, tick)
        sim.at(offset, tick)
        self.flush()

    def _check_recovered(self, group: int, core: RaftGroup) -> None:
        before = self._before_crash.pop(group, None)
        if before is None:
            return
        persisted, term, vote, terms = before
        if core.term < term or (core.term == term and vote is not None and core.vote != vote):
            self.sim.checker.fail(f"{self.id} group {group}: term/vote ({term}, {vote}) on disk "
                                  f"before the crash, ({core.term}, {core.vote}) after")
        log = core.log
        for index in range(log.snapshot_index + 1, persisted + 1):
            if terms[index - 1] and log.term_at(index) != terms[index - 1]:
                self.sim.checker.fail(
                    f"{self.id} group {group}: entry {index} (term {terms[index - 1]}) was on "
                    f"disk before the crash, not after (log {log.snapshot_index}.."
                    f"{log.last_index}, term there {log.term_at(index)})")

    def peer_lost(self, peer: str) -> None:
        if self.alive:
            self.host.peer_lost(peer)
            self.flush()

    def unreachable(self, peer: str) -> None:
        if self.alive:
            self.host.unreachable(peer)
            self.flush()

    def crash(self) -> None:
        for group in self.machines:
            core = self.host.core(group)
            log = core.log
            durable = core._durable  # what the core believes is on disk
            persisted = min(core.persisted_index, log.last_index)
            terms = [log.term_at(i) or 0 for i in range(1, persisted + 1)]  # 0: compacted
            self._before_crash[group] = (persisted, durable.term, durable.vote, terms)
            self.transfers_aborted += core.transfers_aborted
        self.alive = False
        self.incarnation += 1
        self._written = []
        self.syncing = False
        self.store.crash(self.sim.rng, self.sim.options.torn_writes)

    def flush(self) -> None:
        """As the node's shell: again while applying made more to send (at most 4 rounds,
        as a turn of its event loop would end between them)."""
        for _ in range(4):
            self._flush_once()
            if not self.alive or not self.host.has_ready():
                return

    def _flush_once(self) -> None:
        if not self.alive:
            return
        host = self.host
        checker = self.sim.checker
        commits = {group: host.core(group).commit for group in self.machines}
        batch = host.flush()
        host.apply_errors.clear()  # only snapshot chunks fail here: their transfer starts over
        self._start_installs()
        for group in self.machines:
            core = host.core(group)
            role = (core.role, core.term)
            if role != self._roles.get(group) and core.role == LEADER:
                checker.on_leader(group, core.term, self.id, core)
            self._roles[group] = role
            if core.role == LEADER and core.commit > commits[group]:
                checker.on_commit(group, core, commits[group])
        if batch is None or batch.wal is None:
            return
        self.wal.write(batch.wal)
        self._written.append((batch, batch.wal))
        if not self.syncing:
            self._start_sync()

    def _start_installs(self) -> None:
        """As the shell: each install handed off the loop finishes once its work is over
        (a crash meanwhile forgets it, as a process's threads die with it)."""
        installs, self.host.installs = self.host.installs, []
        incarnation = self.incarnation
        for group, pending in installs:
            pending.start(functools.partial(self._installed, group, incarnation))

    def _installed(self, group: int, incarnation: int) -> None:
        if self.incarnation != incarnation or not self.alive:
            return
        self.host.installed(group)
        self.host.apply_errors.clear()
        self._start_installs()
        self.flush()

    def _start_sync(self) -> None:
        self.syncing = True
        incarnation = self.incarnation
        written, self._written = self._written, []

        def done() -> None:
            if self.incarnation != incarnation:
                return
            self.wal.sync([wal for _, wal in written])
            for batch, _ in written:
                self.host.synced(batch)
            self.syncing = False
            self.flush()
            if self._written and not self.syncing:
                self._start_sync()
        rng = self.sim.rng
        stall = rng.random() < self.sim.options.disk_stalls
        self.sim.at(2 + rng.random() * 6 if stall else 0.02 + rng.random() * 0.3, done)


def run(seed: int, options: Options) -> Simulation:
    sim = Simulation(seed, options)
    try:
        sim.run()
    except Exception:
        print(f"raft simulation FAILED: seed {seed} at step {sim.steps} (time {sim.now:.1f}); "
              f"replay: python -m tests.raft.sim --seed {seed} --steps {options.steps}",
              file=sys.stderr)
        raise
    return sim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, help="replay this seed only")
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=None, help="first seed (default: random)")
    parser.add_argument("--steps", type=int, default=100_000, help="steps per seed")
    args = parser.parse_args()
    options = Options(steps=args.steps)
    if args.seed is not None:
        seeds = [args.seed]
    else:
        first = args.first if args.first is not None else random.randrange(1 << 32)
        seeds = list(range(first, first + args.seeds))
    total = 0
    started = time.perf_counter()
    for seed in seeds:
        sim = run(seed, options)
        total += sim.steps
        print(f"seed {seed}: {sim.steps} steps, {sim.checker.acks} acknowledged, "
              f"{sim.checker.reads} reads, {sim.crashes} crashes, {sim.partitions} partitions, "
              f"{sim.link_drops} link drops, "
              f"{sim.changes} membership changes, {sim.checker.installs} snapshots installed "
              f"({sim.chunk_failures()} chunks failed, {sim.deferred_installs()} off the loop), "
              f"{len(sim.transfers)} transfers ({sim.transfers_done()} done, "
              f"{sim.transfers_aborted()} given up), {len(sim.checker.leaders)} leaders: ok")
    print(f"{len(seeds)} seeds, {total} steps in {time.perf_counter() - started:.0f} s: "
          f"no violation (seeds {seeds[0]}..{seeds[-1]})")


if __name__ == "__main__":
    main()
