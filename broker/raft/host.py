"""A node's Raft groups on one write-ahead log, still without I/O of its own.

The host turns the groups' Readies into one write-ahead log batch per call of `flush()`
(group commit), sends what may leave at once, holds back the after-persist messages until
`synced(batch)` says the batch is on disk, applies committed entries to each group's state
machine and settles proposals and reads. The asyncio shell (node.py) and the deterministic
simulation (tests/raft/) drive this same object: the shell commits batches with a real
fdatasync in a worker thread, the simulation with a simulated disk.

Bad input from a peer (garbled bytes, an unknown group, a stale term) is dropped and
counted, never raised.
"""

import random
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

from broker.raft.core import LEADER, ROLE_NAMES, RaftGroup
from broker.raft.messages import Config, Entry, MalformedMessage, Message, decode, encode
from broker.raft.ready import Ready, SnapshotChunk, SnapshotMeta, SnapshotRequest
from broker.raft.wal import RecoveredGroup, WalBatch, WriteAheadLog

# A histogram's value: cumulative (upper bound, count) buckets ending with "+Inf", and the sum.
Histogram = tuple[list[tuple[str, float]], float]
# (name, "counter" | "gauge" | "histogram", help, labels, value): what broker.metrics turns
# into families, without the Raft package importing anything else of the broker.
Sample = tuple[str, str, str, dict[str, str], float | Histogram]


class Transport(Protocol):
    """The cluster link to the other nodes; `send` must not block (it queues)."""

    def send(self, peer: str, data: bytes) -> None: ...

    def flush(self) -> None:
        """What was sent leaves now. The host calls it once a flush's messages are all
        sent (if it sent any), and before it applies entries: a follower starts its fsync,
        a leader learns of a commit, without waiting for the rest of the event loop's turn
        (on a busy leader, its client traffic)."""


class ApplyFailed(Exception):
    """A state machine could not apply an entry for a reason outside it (its storage had
    no space), only raised by a machine that is `Rewindable`. Any other exception from
    `apply` is a bug and propagates. The cause is an attribute, not only `__cause__`: the
    shell tells a full disk from other failures by it, and compiled code raising this
    must not be able to lose it."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


class StateMachine(Protocol):
    def apply(self, entry: Entry) -> None:
        """A committed entry, in index order (configuration and no-op entries too)."""

    def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool] | None:
        """The bytes at `offset` of the snapshot at `index` (0: one the machine chooses,
        of an index it does not let the log be compacted past): (index, data, done). None
        while the snapshot is being prepared: the core asks again when its snapshot
        transfer times out."""

    def install_chunk(self, chunk: SnapshotChunk) -> "int | PendingInstall | None":
        """A received chunk; the one with `done` replaces the state, durably, at
        `chunk.index`. Raises ApplyFailed when its storage fails (the state it had is
        kept; the transfer starts over). Returns None, or the offset the transfer goes on
        from instead of the chunk's end (RaftGroup.chunk_stored's `resume`), or a
        PendingInstall when the rest of the work runs off the event loop."""


class PendingInstall:
    """An install whose heavy part (rebuilding a database from a snapshot) runs elsewhere,
    a worker thread, so the event loop goes on serving every other group meanwhile. The
    shell calls `start(done)`; `done()` comes from any thread once the work is over, and
    the shell then has the host call `finish()` on the loop: install_chunk's answer (or
    ApplyFailed). Until then the group's chunk stays unanswered (the core answers a chunk
    only once stored) and its committed entries wait."""

    def __init__(self, start: Callable[[Callable[[], object]], None],
                 finish: Callable[[], int | None]) -> None:
        self.start = start
        self.finish = finish


class Rewindable(Protocol):
    """A state machine that may raise ApplyFailed."""

    def rewind(self) -> int:
        """After `apply` raised ApplyFailed: the machine as its storage holds it, reopened as
        a restart would, and the index it holds; the entries after it are applied again.
        Raises while it cannot be reopened (called again later)."""


class HostBatch:
    """One flush: its write-ahead log batch (None when nothing was written) and what waits
    for it to be on disk. (A plain class: a dataclass costs a start ~0.5 ms, issue 42.)"""

    __slots__ = ("after_persist", "readies", "synced", "wal")

    def __init__(self, wal: WalBatch | None) -> None:
        self.wal = wal
        self.readies: list[tuple[RaftGroup, int, int]] = []  # seq, entries
        self.after_persist: list[tuple[str, Message]] = []
        self.synced = False


class _Group:
    __slots__ = ("core", "held", "installing", "last_batch", "machine", "proposals", "reads",
                 "stalled")

    def __init__(self, core: RaftGroup, machine: StateMachine) -> None:
        self.core = core
        self.machine = machine
        # An install running off the loop (its chunk), the chunks received after it and
        # the entries committed meanwhile: handled once it is over (`RaftHost.installed`).
        self.installing: tuple[SnapshotChunk, PendingInstall] | None = None
        self.held: tuple[list[SnapshotChunk], list[Entry]] = ([], [])
        # Committed entries not applied: applying the first raised (`RaftHost.retry`).
        self.stalled: list[Entry] | None = None
        self.last_batch = 0  # entries of this group in the last fsync that had any
        self.proposals: dict[int, tuple[int, Callable[[bool], None]]] = {}
        self.reads: deque[tuple[int, Callable[[bool], None]]] = deque()


def anyone(_peer: str) -> bool:
    return True


class RaftHost:
    """`can_transfer_to(peer)`: whether leadership may be handed to `peer` (TimeoutNow is a
    message a node older than transfers cannot decode; the cluster layer knows versions)."""

    def __init__(self, node_id: str, wal: WriteAheadLog, transport: Transport,
                 rng: random.Random, election_ticks: int = 10, heartbeat_ticks: int = 1,
                 can_transfer_to: Callable[[str], bool] = anyone) -> None:
        self.id = node_id
        self.can_transfer_to = can_transfer_to
        self.wal = wal
        self.transport = transport
        self._rng = rng
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.groups: dict[int, _Group] = {}
        self._unsynced: deque[HostBatch] = deque()
        self.dropped_malformed = 0
        self.dropped_unknown_group = 0
        self.messages_sent = 0
        self.messages_received = 0
        # (group, error) of applies and rewinds that raised, for the shell to report.
        self.apply_errors: list[tuple[int, BaseException]] = []
        # (group, install) started off the loop, for the shell to `start` (see
        # PendingInstall) and to report back through `installed(group)`.
        self.installs: list[tuple[int, PendingInstall]] = []

    def add_group(self, group: int, machine: StateMachine,
                  recovered: RecoveredGroup | None = None, voters: frozenset[str] = frozenset(),
                  applied: int = 0, snapshot: SnapshotMeta | None = None) -> RaftGroup:
        """Hosts a group: from its recovered state, else new (a bootstrap member when
        `voters` is given, else a server that waits to be added). `applied`: the state
        machine's durable applied index; `snapshot`: the last snapshot it installed."""
        state = recovered or RecoveredGroup()
        core = RaftGroup(group, self.id, random.Random(self._rng.random()), term=state.term,
                         vote=state.vote, log=state.log, applied=applied, snapshot=snapshot,
                         election_ticks=self.election_ticks,
                         heartbeat_ticks=self.heartbeat_ticks)
        if voters:
            core.bootstrap(Config(voters))
        self.groups[group] = _Group(core, machine)
        return core

    def core(self, group: int) -> RaftGroup:
        return self.groups[group].core

    # ----------------------------------------------------------------- inputs

    def tick(self) -> None:
        for hosted in self.groups.values():
            hosted.core.tick()

    def receive(self, peer: str, data: bytes) -> None:
        try:
            message = decode(data)
        except MalformedMessage:
            self.dropped_malformed += 1
            return
        hosted = self.groups.get(message.group)
        if hosted is None:
            self.dropped_unknown_group += 1
            return
        self.messages_received += 1
        hosted.core.step(peer, message)

    def propose(self, group: int, data: bytes, done: Callable[[bool], None]) -> int:
        """Proposes a command; `done(True)` once it is applied here, `done(False)` if another
        entry took its index. Raises NotLeader."""
        hosted = self.groups[group]
        index, term = hosted.core.propose(data)
        hosted.proposals[index] = (term, done)
        return index

    def read_index(self, group: int, done: Callable[[bool], None]) -> None:
        """`done(True)` when a linearizable read may be served from the local state machine,
        `done(False)` when leadership was lost first. Raises NotLeader."""
        self.groups[group].core.read_index(done)

    def compact(self, group: int, index: int) -> None:
        self.groups[group].core.compact(index)

    def transfer_leadership(self, group: int) -> str | None:
        """Starts handing the group's leadership (this node must lead it) to the voter
        `can_transfer_to` allows whose log is the most complete, one heard from lately first
        (a transfer to a dead one would only time out); None when there is no such voter."""
        core = self.groups[group].core
        candidates = [(pr.match, pr.active, peer) for peer, pr in core.progress.items()
                      if peer in core.log.config.voters and self.can_transfer_to(peer)]
        if core.role != LEADER or not candidates:
            return None
        target = max(candidates)[2]
        core.transfer_leadership(target)
        return target

    def unreachable(self, peer: str) -> None:
        """The link to `peer` came back, or was given up as silent: see
        RaftGroup.unreachable."""
        for hosted in self.groups.values():
            hosted.core.unreachable(peer)

    def peer_lost(self, peer: str) -> None:
        """`peer`'s end closed the link (EOF, reset): see RaftGroup.peer_lost."""
        for hosted in self.groups.values():
            hosted.core.peer_lost(peer)

    # ---------------------------------------------------------------- outputs

    def flush(self, write: Callable[[HostBatch], None] | None = None) -> HostBatch | None:
        """Collects every group's Ready into one batch; None when there was nothing.
        Call `synced(batch)` once `batch.wal` is committed (at once when it is None).
        `write(batch)` is called with the batch before the committed entries are applied,
        so the log's fsync runs while the state machines work: on a follower the apply of
        entry N would otherwise delay the fsync of N+1, which the leader waits for. What
        applying makes to send waits for the next flush (`has_ready`)."""
        busy = [hosted for hosted in self.groups.values() if hosted.core.has_ready()]
        if not busy:
            return None
        batch = HostBatch(None)
        sent = self.messages_sent
        readies = [(hosted, self._collect(hosted, batch)) for hosted in busy]
        if self.messages_sent != sent:
            self.transport.flush()
        if self.wal.pending():
            batch.wal = self.wal.take()
        self._unsynced.append(batch)
        if batch.wal is None:
            self.synced(batch)
        elif write is not None:
            write(batch)
        for hosted, ready in readies:
            self._settle(hosted, ready)
        return batch

    def has_ready(self) -> bool:
        """Whether a flush would find something (after one, what applying made)."""
        return any(hosted.core.has_ready() for hosted in self.groups.values())

    def _collect(self, hosted: "_Group", batch: HostBatch) -> Ready:
        """A group's Ready into the batch: its log writes, and its messages sent (those
        allowed before the fsync) or held for `synced`."""
        core = hosted.core
        ready = core.ready()
        group = core.group
        if ready.snapshot_chunks or ready.snapshot_requests:
            self._store_chunks(hosted, ready.snapshot_chunks)
            ready.messages += self._give_chunks(hosted, ready.snapshot_requests)
        wal = self.wal
        if ready.hard_state is not None:
            wal.hard_state(group, ready.hard_state)
        if ready.snapshot is not None:
            wal.snapshot(group, ready.snapshot)
        if ready.entries:
            wal.entries(group, ready.entries)
        send = self.transport.send
        for peer, message in ready.messages:
            send(peer, encode(message))
        self.messages_sent += len(ready.messages)
        batch.readies.append((core, ready.seq, len(ready.entries)))
        batch.after_persist.extend(ready.after_persist)
        return ready

    def _store_chunks(self, hosted: "_Group", chunks: list[SnapshotChunk]) -> None:
        """Hands received chunks to the machine, in order, and tells the core of each;
        those after an install that goes on off the loop wait for it (`installed`)."""
        if hosted.installing is not None:
            hosted.held[0].extend(chunks)
            return
        core = hosted.core
        stored = True  # after a chunk that failed, the rest of the transfer is not stored
        moved = False  # the machine moved the transfer elsewhere (its `resume`)
        for position, chunk in enumerate(chunks):
            if moved and chunk.offset:
                continue  # sent before the leader heard of the move: it sends them again
            moved = False
            resume: int | None = None
            if stored:
                try:
                    answer = hosted.machine.install_chunk(chunk)
                except ApplyFailed as error:
                    stored = False
                    self.apply_errors.append((core.group, error.cause))
                else:
                    if isinstance(answer, PendingInstall):
                        hosted.installing = (chunk, answer)
                        hosted.held[0].extend(chunks[position + 1:])
                        self.installs.append((core.group, answer))
                        return
                    resume = answer
            core.chunk_stored(chunk, stored, resume)
            moved = resume is not None

    def _give_chunks(self, hosted: "_Group",
                     requests: list[SnapshotRequest]) -> list[tuple[str, Message]]:
        """Answers the core's chunk requests, and those it makes meanwhile while its window
        has room; returns the messages handing chunks over made (RaftGroup.chunk_output),
        which leave with this flush."""
        core = hosted.core
        machine = hosted.machine
        out: list[tuple[str, Message]] = []
        while True:
            for request in requests:
                answer = machine.snapshot_chunk(request.index, request.offset)
                if answer is not None:
                    index, data, done = answer
                    core.send_snapshot_chunk(request.peer, index, request.offset, data, done)
            requests, messages = core.chunk_output()
            out += messages
            if not requests:
                return out

    def installed(self, group: int) -> None:
        """The work of the group's PendingInstall is over: the install finished on the loop
        and the core told; the entries committed meanwhile applied unless the snapshot
        replaced them (the core hands what follows it again); then the chunks that came
        meanwhile."""
        hosted = self.groups.get(group)
        if hosted is None or hosted.installing is None:
            return
        (chunk, pending), (chunks, entries) = hosted.installing, hosted.held
        hosted.installing, hosted.held = None, ([], [])
        core = hosted.core
        stored = True
        resume: int | None = None
        try:
            resume = pending.finish()
        except ApplyFailed as error:
            stored = False
            self.apply_errors.append((group, error.cause))
        core.chunk_stored(chunk, stored, resume)
        if not stored or core.applied_index != chunk.index:
            self._apply(hosted, entries)
        # A transfer started meanwhile, from its first chunk, of a snapshot past what the
        # node holds now; what comes before (the installed one's chunks sent again) is
        # dropped unanswered: the core expects no more of that transfer.
        first = next((n for n, held in enumerate(chunks)
                      if held.offset == 0 and held.index > core.commit), len(chunks))
        self._store_chunks(hosted, chunks[first:])

    def _settle(self, hosted: "_Group", ready: Ready) -> None:
        """The rest of a Ready, once its log writes are on their way: committed entries
        applied, reads answered."""
        core = hosted.core
        if ready.committed:
            if hosted.installing is not None:
                hosted.held[1].extend(ready.committed)
            else:
                self._apply(hosted, ready.committed)
        for context, index in ready.reads:
            assert callable(context)
            if index <= core.applied_index:
                context(True)
            else:
                hosted.reads.append((index, context))
        for context in ready.reads_failed:
            assert callable(context)
            context(False)

    def _apply(self, hosted: "_Group", entries: list[Entry]) -> None:
        """Applies in order; an entry whose apply raises ApplyFailed (a full disk under the
        machine's storage) stalls the group: it and every later entry wait for `retry`, and what
        waits on them (proposals, reads) with them."""
        if hosted.stalled is not None:
            hosted.stalled.extend(entries)
            return
        machine = hosted.machine
        proposals = hosted.proposals
        last = 0
        for position, entry in enumerate(entries):
            try:
                machine.apply(entry)
            except ApplyFailed as error:
                hosted.stalled = entries[position:]
                self.apply_errors.append((hosted.core.group, error.cause))
                break
            last = entry.index
            if proposals:
                waiting = proposals.pop(entry.index, None)
                if waiting is not None:
                    waiting[1](waiting[0] == entry.term)
        if not last:
            return
        hosted.core.applied(last)
        reads = hosted.reads
        while reads and reads[0][0] <= last:
            reads.popleft()[1](True)

    @property
    def stalled(self) -> bool:
        """Some group's entries wait for `retry`."""
        return any(hosted.stalled is not None for hosted in self.groups.values())

    def retry(self) -> None:
        """Each stalled group's machine rewound to what its storage holds (a machine that
        still cannot be stays stalled), then the entries after that applied again."""
        for hosted in self.groups.values():
            stalled = hosted.stalled
            if stalled is None:
                continue
            log = hosted.core.log
            try:
                index = cast(Rewindable, hosted.machine).rewind()  # (it raised ApplyFailed)
                if index < log.snapshot_index:
                    raise RuntimeError(f"the state machine holds index {index}, the log"
                                       f" starts after {log.snapshot_index}")
            except Exception as error:
                self.apply_errors.append((hosted.core.group, error))
                continue
            hosted.stalled = None
            self._apply(hosted, [*log.entries_between(index + 1, stalled[0].index - 1),
                                 *stalled])

    def synced(self, batch: HostBatch) -> None:
        """`batch` is on disk: releases it and every earlier one in order."""
        batch.synced = True
        unsynced = self._unsynced
        send = self.transport.send
        sent = self.messages_sent
        while unsynced and unsynced[0].synced:
            done = unsynced.popleft()
            for core, seq, entries in done.readies:
                core.persisted(seq)
                if entries:
                    hosted = self.groups.get(core.group)
                    if hosted is not None:
                        hosted.last_batch = entries
            for peer, message in done.after_persist:
                send(peer, encode(message))
            self.messages_sent += len(done.after_persist)
        if self.messages_sent != sent:
            self.transport.flush()

    # ---------------------------------------------------------------- metrics

    def metrics(self) -> list[Sample]:
        wal = self.wal
        result: list[Sample] = [
            ("raft_wal_bytes", "counter", "Bytes written to the Raft write-ahead log", {},
             float(wal.bytes_written)),
            ("raft_wal_fsyncs", "counter", "fdatasync calls of the Raft write-ahead log", {},
             float(wal.syncs)),
            ("raft_wal_entries_per_fsync", "gauge",
             "Log entries made durable per fsync, all groups (average since start)", {},
             wal.entries_written / wal.syncs if wal.syncs else 0.0),
            ("raft_wal_last_batch_entries", "gauge",
             "Log entries, all groups, in the last fsync batch", {},
             float(wal.last_batch_entries)),
            ("raft_wal_fsync_seconds", "histogram",
             "Duration of the write-ahead log's fdatasync calls", {},
             (wal.sync_latency.buckets(), wal.sync_latency.sum)),
            ("raft_messages_dropped", "counter", "Raft messages dropped, by reason",
             {"reason": "malformed"}, float(self.dropped_malformed)),
            ("raft_messages_dropped", "counter", "Raft messages dropped, by reason",
             {"reason": "unknown_group"}, float(self.dropped_unknown_group)),
        ]
        for group, hosted in self.groups.items():
            core = hosted.core
            labels = {"group": str(group)}
            result.extend((
                ("raft_role", "gauge", "1 for the role this node has in the group",
                 {**labels, "role": ROLE_NAMES[core.role]}, 1.0),
                ("raft_term", "gauge", "Current term", labels, float(core.term)),
                ("raft_commit_index", "gauge", "Commit index", labels, float(core.commit)),
                ("raft_applied_index", "gauge", "Applied index", labels,
                 float(core.applied_index)),
                ("raft_log_entries", "gauge", "Entries in the log (after the snapshot)",
                 labels, float(len(core.log.entries))),
                ("raft_log_bytes", "gauge", "Bytes of command data in the log", labels,
                 float(sum(len(entry.data) for entry in core.log.entries))),
                ("raft_snapshot_index", "gauge",
                 "Index up to which the log is compacted (the state machine holds it)",
                 labels, float(core.log.snapshot_index)),
                ("raft_last_fsync_batch_entries", "gauge",
                 "Entries of this group in the last fsync that wrote any", labels,
                 float(hosted.last_batch)),
                ("raft_stale_messages", "counter", "Messages of an older term, dropped",
                 labels, float(core.stale_messages)),
                ("raft_elections", "counter", "Elections this node started", labels,
                 float(core.elections)),
                ("raft_transfer_elections", "counter",
                 "Elections this node started because the leader handed over (TimeoutNow)",
                 labels, float(core.transfer_elections)),
                ("raft_transfers", "counter",
                 "Leadership transfers this node started as leader, by outcome",
                 {**labels, "result": "started"}, float(core.transfers)),
                ("raft_transfers", "counter",
                 "Leadership transfers this node started as leader, by outcome",
                 {**labels, "result": "aborted"}, float(core.transfers_aborted)),
            ))
        return result
