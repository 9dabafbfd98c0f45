"""One Raft group's consensus state machine, sans I/O (modelled on h11's connection).

Inputs: `tick()` (logical time), `step(sender, message)`, `propose(data)`,
`persisted(seq)` (a Ready's writes are on disk), `applied(index)`, `compact(index)`,
`read_index(context)`, membership changes, `send_snapshot_chunk` and `snapshot_ready`, and
what the links say of a peer: `unreachable(peer)` (messages may have been lost),
`peer_lost(peer)` (its end closed the connection: it died).
Outputs accumulate until `ready()` hands them over as one `Ready` (see ready.py for what the
shell does with it). No sockets, clocks, threads or files: randomness comes from the
`random.Random` given at construction, so a simulation replays exactly from its seed.

Raft as in the paper and Ongaro's thesis, plus:
- durability: the leader counts itself toward a commit majority only for entries it has
  persisted; vote grants and append acknowledgements wait for the state they promise to be on
  disk (`Ready.after_persist`), while the leader's own AppendEntries leave at once;
- pre-vote (a server asks "would you vote for me?" before raising its term) and check-quorum
  (a leader that has not heard from a majority within an election timeout steps down, and a
  server that heard from a live leader within one ignores vote requests), so neither a
  partitioned nor a removed server disrupts a working group;
- a leader whose connection its followers see closed (a crash: the kernel closes a dead
  process's sockets) is replaced without waiting for an election timeout (`peer_lost`); a
  leader that merely falls silent (frozen, cut off) still is after one;
- learners replicate without voting; a learner is promoted only when caught up;
- membership changes one server at a time, taking effect when appended (thesis 4.1), only
  after the leader committed an entry of its own term, one at a time;
- read index: a leader confirms it still leads with a heartbeat round, then the read waits
  for the state machine to reach the commit index of when it was asked;
- snapshots: the state machine owns its data; compaction drops entries it has flushed, and
  a follower behind the leader's first entry gets the state machine's snapshot in chunks;
- leadership transfer (thesis section 3.10, etcd's MsgTransferLeader/MsgTimeoutNow): the
  leader refuses proposals (NotLeader) and membership changes, brings the target's log up to
  its own, then sends TimeoutNow; the target campaigns at once, without pre-vote, and its
  vote requests say so, so voters grant them despite hearing from a live leader. A transfer
  that did not happen within an election timeout is given up and the leader goes on.
"""

import hashlib
import random
from collections import deque
from typing import Final

from broker.raft.log import RaftLog
from broker.raft.messages import (
    CONFIG,
    NOOP,
    NORMAL,
    AppendEntries,
    AppendResponse,
    Commit,
    Config,
    Entry,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    RequestVote,
    SnapshotResponse,
    TimeoutNow,
    VoteResponse,
)
from broker.raft.progress import PROBE, REPLICATE, SNAPSHOT, SNAPSHOT_WINDOW, Progress
from broker.raft.ready import (
    HardState,
    Ready,
    SnapshotChunk,
    SnapshotMeta,
    SnapshotRequest,
)

FOLLOWER: Final = 0
PRE_CANDIDATE: Final = 1
CANDIDATE: Final = 2
LEADER: Final = 3
ROLE_NAMES: Final = ("follower", "pre-candidate", "candidate", "leader")


class NotLeader(Exception):
    """Only the leader proposes, reads by index and changes membership; `leader` is the
    one this server knows of (None when there is an election)."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader})")
        self.leader = leader


class ConfigChangeRefused(Exception):
    pass


class TransferRefused(Exception):
    """A leadership transfer to a server that is not another voter of the group."""


class RaftGroup:
    def __init__(self, group: int, node_id: str, rng: random.Random, *, term: int = 0,
                 vote: str | None = None, log: RaftLog | None = None, applied: int = 0,
                 snapshot: SnapshotMeta | None = None,
                 election_ticks: int = 10, heartbeat_ticks: int = 1,
                 max_append_bytes: int = 1 << 20, catch_up_entries: int = 1000) -> None:
        self.group = group
        self.id = node_id
        self._rng = rng
        self.term = term
        self.vote = vote
        self.log = log if log is not None else RaftLog()
        if snapshot is not None and snapshot.index > self.log.snapshot_index:
            # The state machine installed it; the log's marker did not reach the disk.
            self.log.restore(snapshot.index, snapshot.term, snapshot.config)
        self.role = FOLLOWER
        self.leader: str | None = None
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.max_append_bytes = max_append_bytes
        self.catch_up_entries = catch_up_entries
        # A follower whose log is empty (a new replica) gets the state machine's snapshot
        # even when the log still holds every entry: set by a machine whose snapshot ships
        # what it holds faster than replaying the log rebuilds it (sealed generations, as
        # files: broker/ds/replication_shard.py).
        self.snapshot_empty_followers = False
        self._elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = self._random_timeout()
        # What is on disk: recovered state is.
        self.persisted_index = self.log.last_index
        self._durable = HardState(term, vote)
        self._emitted = self._durable
        # applied <= handed <= min(commit, persisted_index)
        self.commit = max(applied, self.log.snapshot_index)
        self.applied_index = self.commit
        self._handed = self.commit
        self._votes: dict[str, bool] = {}
        # Pre-votes ignored while a leader was heard, by sender: see `peer_lost`.
        self._deferred: dict[str, RequestVote] = {}
        self.progress: dict[str, Progress] = {}
        self._heartbeat_seq = 0
        self._reads_unconfirmed: list[object] = []  # read-index requests without a round
        self._reads: deque[tuple[object, int, int]] = deque()  # (context, index, seq)
        self._committed_in_term = False
        self._receiving: tuple[int, int, int] = (0, 0, 0)  # snapshot index, term, offset
        self._chunk_from = ""  # the leader the chunks in _chunks came from
        # The voter this leader hands its leadership to (None: no transfer under way).
        self.transferee: str | None = None
        self._transfer_ticks = 0
        self._timeout_now_sent = False
        # The Ready being collected.
        self._seq = 0
        self._unstable = 0  # the first index to write (0: none)
        self._snapshot: SnapshotMeta | None = None
        if snapshot is not None and snapshot.index == self.log.snapshot_index:
            self._snapshot = snapshot
        self._messages: list[tuple[str, Message]] = []
        self._after_persist: list[tuple[str, Message]] = []
        self._chunks: list[SnapshotChunk] = []
        self._snapshot_requests: list[SnapshotRequest] = []
        self._reads_ready: list[tuple[object, int]] = []
        self._reads_failed: list[object] = []
        self._role_changed = False
        self._to_replicate: dict[str, None] = {}  # (a dict: ordered, for replays)
        self._batches: deque[list[int]] = deque()  # [seq, last index written] not yet synced
        self._batch_states: dict[int, HardState] = {}
        # Counters for metrics and tests.
        self.stale_messages = 0
        self.elections = 0
        self.transfers = 0  # transfers this server started as leader
        self.transfers_aborted = 0  # of those, given up after an election timeout
        self.transfer_elections = 0  # elections it started on a leader's TimeoutNow
        self._alone_campaigns_at_once()

    # ----------------------------------------------------------------- inputs

    def bootstrap(self, config: Config) -> None:
        """Starts a new group: every initial member writes the same configuration entry at
        index 1 of term 1, so their logs agree from the start. A server joining later starts
        empty and learns the configuration from the leader."""
        if self.log.last_index or self.term:
            return
        self.term = 1
        self._append(Entry(1, 1, CONFIG, config.encode()))
        self._alone_campaigns_at_once()

    def _alone_campaigns_at_once(self) -> None:
        """The only voter has nobody to wait for: it campaigns on its first tick instead of
        after an election timeout (a single node acknowledges its first commands at once,
        after a start as after a restart)."""
        if self.log.config.voters == {self.id}:
            self._elapsed = self._timeout

    def tick(self) -> None:
        self._elapsed += 1
        if self.role == LEADER:
            self._heartbeat_elapsed += 1
            if self._heartbeat_elapsed >= self.heartbeat_ticks:
                self._heartbeat_elapsed = 0
                self._broadcast_heartbeat()
            if self._elapsed >= self.election_ticks:
                self._elapsed = 0
                self._check_quorum()
            self._tick_snapshots()
            if self.transferee is not None:
                self._transfer_ticks += 1
                if self._transfer_ticks >= self.election_ticks:
                    self.transfers_aborted += 1
                    self._end_transfer()
        elif self._elapsed >= self._timeout and self.id in self.log.config.voters:
            self._campaign(pre_vote=True)

    def step(self, sender: str, m: Message) -> None:
        if m.term > self.term:
            if isinstance(m, RequestVote):
                if (self.leader is not None and self._elapsed < self.election_ticks
                        and not m.transfer):
                    # A live leader: the requester is partitioned or removed, or it lost
                    # the leader before this server did (answered then: `peer_lost`).
                    if m.pre_vote and sender in self.log.config.voters:
                        self._deferred[sender] = m
                    return
                if not m.pre_vote:
                    self._become_follower(m.term, None)
            elif not (isinstance(m, VoteResponse) and m.pre_vote and m.granted):
                # (A pre-vote grant carries the term the pre-candidate would take.)
                leads = isinstance(m, (AppendEntries, Heartbeat, Commit, InstallSnapshot,
                                       TimeoutNow))
                self._become_follower(m.term, sender if leads else None)
        elif m.term < self.term:
            self.stale_messages += 1
            if isinstance(m, (AppendEntries, Heartbeat, Commit)):
                # A deposed leader learns of the newer term and steps down.
                self._reply(sender, AppendResponse(self.group, self.term, False, 0, 0))
            elif isinstance(m, RequestVote) and m.pre_vote:
                self._reply(sender, VoteResponse(self.group, self.term, False, True))
            return
        if isinstance(m, AppendEntries):
            self._on_append(sender, m)
        elif isinstance(m, Heartbeat):
            self._on_heartbeat(sender, m)
        elif isinstance(m, Commit):
            self._on_commit(sender, m.commit)
        elif isinstance(m, InstallSnapshot):
            self._on_snapshot(sender, m)
        elif isinstance(m, RequestVote):
            self._on_vote_request(sender, m)
        elif isinstance(m, VoteResponse):
            self._on_vote_response(sender, m)
        elif isinstance(m, TimeoutNow):
            self._on_timeout_now()
        elif self.role == LEADER:
            pr = self.progress.get(sender)
            if pr is None:
                return
            pr.active = True
            if isinstance(m, AppendResponse):
                self._on_append_response(sender, pr, m)
            elif isinstance(m, HeartbeatResponse):
                self._on_heartbeat_response(sender, pr, m)
            else:
                self._on_snapshot_response(sender, pr, m)

    def propose(self, data: bytes) -> tuple[int, int]:
        """Appends a command; returns its (index, term). It is committed when the state
        machine is handed an entry at that index with that term; a different term there
        means it was lost to a change of leader. Refused during a leadership transfer (with
        its target as the leader to ask): the target's log must catch up with an end that
        stays put, and what the leader appended after TimeoutNow would be lost."""
        if self.role != LEADER or self.transferee is not None:
            raise NotLeader(self.leader if self.transferee is None else self.transferee)
        index = self.log.last_index + 1
        self._append(Entry(index, self.term, NORMAL, data))
        return index, self.term

    def persisted(self, seq: int) -> None:
        """Every Ready up to `seq` is on disk."""
        batches = self._batches
        while batches and batches[0][0] <= seq:
            done, last = batches.popleft()
            self.persisted_index = max(self.persisted_index, last)
            state = self._batch_states.pop(done, None)
            if state is not None:
                self._durable = state
        if self.role == LEADER:
            self._maybe_commit()
        elif self.role == CANDIDATE:
            self._tally()

    def unreachable(self, peer: str) -> None:
        """Messages to `peer` may have been lost (its link dropped or came back): a leader
        replicating to it optimistically starts again from what it acknowledged, as etcd's
        ReportUnreachable does, and probes it at once. Without it, appends lost with a link
        stay unsent until a new entry shows the gap, and a follower whose link came back
        (and who stood, having seen it close) hears from its leader a heartbeat later."""
        pr = self.progress.get(peer)
        if self.role == LEADER and pr is not None and pr.state != SNAPSHOT:
            pr.become_probe()
            self._to_replicate[peer] = None

    def peer_lost(self, peer: str) -> None:
        """The connection to `peer` was closed by its end (EOF or reset: its process died or
        stopped), which is news a silence is not: `ra` elects on Erlang's nodedown rather
        than after an election timeout. What was in flight to it is lost (`unreachable`);
        and when `peer` led this group, this voter stops believing in it and campaigns
        without waiting for the timeout: at once if it comes first in `succession(peer)`,
        else two ticks per place later (the first tick may come at once), so that the
        survivors do not stand in the same instant and split the vote: the next one grants
        the first's pre-vote and votes for it, or stands itself if the first cannot win
        (its log is behind, or it is down too).

        Pre-vote keeps this from disrupting a healthy leader when only this link dropped
        (a flapping link, a proxy closing it): the other voters still hear the leader and
        ignore the pre-vote, which fails, and the leader's probe over the new link makes
        this server its follower again, the term unchanged. A voter that ignored a pre-vote
        for that reason answers it once it loses the same leader (`_deferred`), so the
        first survivor to stand does not wait for an election timeout because its request
        beat the other survivor's own news of the crash."""
        self.unreachable(peer)
        if self.role != FOLLOWER or peer != self.leader:
            return
        self.leader = None  # (a learner too: what it forwards waits for the next one)
        if self.id not in self.log.config.voters:
            return
        deferred, self._deferred = self._deferred, {}
        for sender, request in deferred.items():
            if request.term > self.term:
                self._on_vote_request(sender, request)
        rank = self.succession(peer).index(self.id)
        if rank == 0:
            self._campaign(pre_vote=True)
        else:
            self._elapsed = max(self._elapsed, self._timeout - 2 * rank)

    def succession(self, lost: str) -> list[str]:
        """The order in which the other voters stand when the leader `lost` is: by ID,
        rotated by a hash of group and term (the same on every survivor), so that the
        groups a node led spread over the survivors as randomised timeouts would spread
        them, and crash after crash leadership does not pile up on one node (as it does
        with a rotation by group + term, or by a CRC of them: the choice that made a winner
        is carried into its next term)."""
        survivors = sorted(self.log.config.voters - {lost})
        digest = hashlib.blake2b(b"%d/%d" % (self.group, self.term), digest_size=4).digest()
        turn = int.from_bytes(digest, "big") % len(survivors)
        return survivors[turn:] + survivors[:turn]

    def applied(self, index: int) -> None:
        self.applied_index = max(self.applied_index, index)

    def snapshot_ready(self) -> None:
        """The state machine can answer now, after answering a request with None (it was
        preparing the snapshot, or pacing its transfers to their byte rate): the chunks it
        did not give are asked for again at once, not after the transfer's timeout."""
        if self.role != LEADER:
            return
        pending = {request.peer for request in self._snapshot_requests}
        for peer, pr in self.progress.items():
            if pr.state == SNAPSHOT and pr.snapshot_asked >= 0 and peer not in pending:
                pr.snapshot_ticks = 0
                self._ask_chunk(peer, pr, pr.snapshot_index, pr.snapshot_asked)

    def compact(self, index: int) -> None:
        """The state machine's data is flushed up to `index`: entries up to there go."""
        index = min(index, self.applied_index)
        if index <= self.log.snapshot_index:
            return
        self.log.compact(index)
        self._snapshot = SnapshotMeta(index, self.log.snapshot_term, self.log.snapshot_config)

    def read_index(self, context: object) -> None:
        """Asks for a linearizable read: `context` comes back in `Ready.reads` with the index
        the state machine must have applied before the read is served."""
        if self.role != LEADER:
            raise NotLeader(self.leader)
        self._reads_unconfirmed.append(context)

    def add_learner(self, node: str) -> int:
        config = self._config_change_allowed()
        if node in config.members():
            raise ConfigChangeRefused(f"{node} is already a member")
        return self._change_config(Config(config.voters, config.learners | {node}))

    def promote(self, node: str) -> int:
        """Makes a caught-up learner a voter."""
        config = self._config_change_allowed()
        if node not in config.learners:
            raise ConfigChangeRefused(f"{node} is not a learner")
        pr = self.progress[node]
        if not self.caught_up(pr):
            raise ConfigChangeRefused(
                f"{node} has not caught up ({pr.match} of {self.log.last_index})")
        return self._change_config(Config(config.voters | {node}, config.learners - {node}))

    def caught_up(self, pr: Progress) -> bool:
        """A learner close enough to the log's end to vote: within `catch_up_entries`, and
        holding something (a new one acknowledged nothing yet, however short the log; one
        that gets a snapshot, as a new shard replica gets its sealed generations as files,
        holds nothing until it is installed)."""
        last = self.log.last_index
        return (pr.state != SNAPSHOT and (pr.match > 0 or last == 0)
                and pr.match >= self.log.snapshot_index
                and pr.match + self.catch_up_entries >= last)

    def remove(self, node: str) -> int:
        config = self._config_change_allowed()
        if node not in config.members():
            raise ConfigChangeRefused(f"{node} is not a member")
        if config.voters == {node}:
            raise ConfigChangeRefused("cannot remove the last voter")
        return self._change_config(Config(config.voters - {node}, config.learners - {node}))

    def transfer_leadership(self, target: str) -> None:
        """Hands leadership to the voter `target` (a transfer under way to another one is
        replaced): see the module's docstring. Raises NotLeader, TransferRefused."""
        if self.role != LEADER:
            raise NotLeader(self.leader)
        if target == self.id or target not in self.log.config.voters:
            raise TransferRefused(f"{target} is not another voter of group {self.group}")
        if self.transferee == target:
            return
        self.transferee = target
        self._transfer_ticks = 0
        self._timeout_now_sent = False
        self.transfers += 1
        self._to_replicate[target] = None
        self._maybe_send_timeout_now()

    def send_snapshot_chunk(self, peer: str, index: int, offset: int, data: bytes,
                            done: bool) -> None:
        """The state machine's answer to a SnapshotRequest. Ignored when the peer no longer
        waits for it (leadership or its state changed meanwhile)."""
        pr = self.progress.get(peer)
        if self.role != LEADER or pr is None or pr.state != SNAPSHOT:
            return
        term = self.log.term_at(index)
        if term is None or index > self.applied_index or (pr.snapshot_index not in (0, index)):
            pr.become_probe()  # the snapshot is gone: start again with a new one
            self._to_replicate[peer] = None
            return
        if offset != pr.snapshot_asked:
            return  # asked before the follower moved the transfer elsewhere: no use now
        pr.snapshot_index = index
        pr.snapshot_ticks = 0
        pr.snapshot_asked = -1
        pr.snapshot_end = offset + len(data)
        pr.snapshot_sent.append(pr.snapshot_end)
        pr.snapshot_last_sent = done
        self._messages.append((peer, InstallSnapshot(
            self.group, self.term, index, term, self.log.config_at(index), offset, data,
            done)))
        self._ask_next_chunk(peer, pr)

    def chunk_output(self) -> tuple[list[SnapshotRequest], list[tuple[str, Message]]]:
        """What handing chunks over since `ready()` made: on a leader, the requests for the
        chunks its window has room for next and the InstallSnapshot messages of those the
        machine gave; on a follower, its answers to the chunks the machine stored. None of
        these messages waits for the log (`_reply` holds back what does), so the shell
        sends them in the same flush and answers the requests there too: a whole window of
        chunks leaves at once, and each chunk's answer as soon as it is stored (one step
        per flush waited a turn of both event loops for each chunk)."""
        requests, self._snapshot_requests = self._snapshot_requests, []
        messages, self._messages = self._messages, []
        return requests, messages

    # ---------------------------------------------------------------- outputs

    def has_ready(self) -> bool:
        # The shell asks every group after every event-loop turn: the likely answers come
        # first and nothing is allocated.
        emitted = self._emitted
        return bool(
            self._unstable or self._messages or self._to_replicate or self._after_persist
            or (self._handed < self.commit and self._handed < self.persisted_index)
            or emitted.term != self.term or emitted.vote != self.vote
            or self._snapshot is not None or self._chunks or self._snapshot_requests
            or self._reads_ready or self._reads_failed or self._role_changed
            or (bool(self._reads_unconfirmed) and self._committed_in_term
                and self.role == LEADER))

    def ready(self) -> Ready:
        if self.role == LEADER:
            for peer in self._to_replicate:
                self._send_appends(peer)
            if self._reads_unconfirmed and self._committed_in_term:
                self._confirm_reads()
        self._to_replicate.clear()
        self._seq += 1
        seq = self._seq
        ready = Ready(seq)
        state = HardState(self.term, self.vote)
        if state != self._emitted:
            ready.hard_state = self._emitted = state
            self._batch_states[seq] = state
        if self._snapshot is not None:
            ready.snapshot = self._snapshot
            self._snapshot = None
        if self._unstable:
            ready.entries = self.log.entries_between(self._unstable, self.log.last_index)
            self._unstable = 0
        if ready.has_writes():
            self._batches.append([seq, self.log.last_index])
        top = min(self.commit, self.persisted_index)
        if self._handed < top:
            ready.committed = self.log.entries_between(self._handed + 1, top)
            self._handed = top
        ready.messages, self._messages = self._messages, []
        ready.after_persist, self._after_persist = self._after_persist, []
        ready.snapshot_chunks, self._chunks = self._chunks, []
        ready.snapshot_requests, self._snapshot_requests = self._snapshot_requests, []
        ready.reads, self._reads_ready = self._reads_ready, []
        ready.reads_failed, self._reads_failed = self._reads_failed, []
        ready.role_changed, self._role_changed = self._role_changed, False
        return ready

    # ------------------------------------------------------------ elections

    def _random_timeout(self) -> int:
        return self.election_ticks + self._rng.randrange(self.election_ticks)

    def _campaign(self, pre_vote: bool, transfer: bool = False) -> None:
        self._elapsed = 0
        self._timeout = self._random_timeout()
        self._votes = {self.id: True}
        # A node that campaigns no longer believes in a leader, pre-vote included (etcd's
        # becomePreCandidate): otherwise it keeps ignoring the other survivors' pre-votes for
        # an election timeout after its own, and elections after a leader crash took up to
        # several timeouts.
        self.leader = None
        if pre_vote:
            self._set_role(PRE_CANDIDATE)
            term = self.term + 1
        else:
            self._set_role(CANDIDATE)
            self.term += 1
            self.vote = self.id
            self.elections += 1
            term = self.term
        request = RequestVote(self.group, term, self.log.last_index, self.log.last_term,
                              pre_vote, transfer)
        for peer in sorted(self.log.config.voters):
            if peer != self.id:
                self._messages.append((peer, request))
        self._tally()

    def _on_vote_request(self, sender: str, m: RequestVote) -> None:
        up_to_date = (m.last_term > self.log.last_term
                      or (m.last_term == self.log.last_term
                          and m.last_index >= self.log.last_index))
        if m.pre_vote:
            can_vote = m.term > self.term or self.vote == sender or (
                self.vote is None and self.leader is None)
        else:
            can_vote = self.vote == sender or (self.vote is None and self.leader is None)
        granted = can_vote and up_to_date
        if granted and not m.pre_vote:
            self.vote = sender
            self._elapsed = 0
        term = m.term if granted and m.pre_vote else self.term
        self._reply(sender, VoteResponse(self.group, term, granted, m.pre_vote))

    def _on_timeout_now(self) -> None:
        """The leader of this term hands over (step() made this server its follower):
        an election now, skipping pre-vote and the election timer."""
        if self.role == FOLLOWER and self.id in self.log.config.voters:
            self.transfer_elections += 1
            self._campaign(pre_vote=False, transfer=True)

    def _maybe_send_timeout_now(self) -> None:
        """TimeoutNow, once, when the transfer's target matches the whole log."""
        target = self.transferee
        pr = self.progress.get(target) if target is not None else None
        if pr is None:
            self._end_transfer()
        elif not self._timeout_now_sent and pr.match == self.log.last_index:
            assert target is not None
            self._timeout_now_sent = True
            self._messages.append((target, TimeoutNow(self.group, self.term)))

    def _end_transfer(self) -> None:
        self.transferee = None
        self._transfer_ticks = 0
        self._timeout_now_sent = False

    def _on_vote_response(self, sender: str, m: VoteResponse) -> None:
        if self.role == PRE_CANDIDATE:
            if not m.pre_vote or (m.granted and m.term != self.term + 1):
                return
        elif self.role != CANDIDATE or m.pre_vote:
            return
        if sender in self.log.config.voters:
            self._votes.setdefault(sender, m.granted)
        self._tally()

    def _tally(self) -> None:
        voters = self.log.config.voters
        quorum = len(voters) // 2 + 1
        granted = sum(1 for peer, yes in self._votes.items() if yes and peer in voters)
        refused = sum(1 for peer, yes in self._votes.items() if not yes and peer in voters)
        if granted >= quorum:
            if self.role == PRE_CANDIDATE:
                self._campaign(pre_vote=False)
            elif self._durable == HardState(self.term, self.id):
                # Only once its own vote is on disk: a crash must not let it vote again.
                self._become_leader()
        elif refused >= quorum:
            self._become_follower(self.term, None)

    def _become_follower(self, term: int, leader: str | None) -> None:
        self._end_transfer()
        if term != self.term:
            self.term = term
            self.vote = None
        self.leader = leader
        self._elapsed = 0
        self._timeout = self._random_timeout()
        if self.role == LEADER:
            self._reads_failed.extend(self._reads_unconfirmed)
            self._reads_failed.extend(context for context, _, _ in self._reads)
            self._reads_unconfirmed.clear()
            self._reads.clear()
            self.progress = {}
        if self.role != FOLLOWER:
            self._set_role(FOLLOWER)

    def _become_leader(self) -> None:
        self._set_role(LEADER)
        self.leader = self.id
        self._elapsed = 0
        self._heartbeat_elapsed = 0
        self._committed_in_term = False
        self._end_transfer()
        self.progress = {}
        for peer in sorted(self.log.config.members()):
            if peer != self.id:
                self.progress[peer] = Progress(self.log.last_index + 1)
        self._append(Entry(self.log.last_index + 1, self.term, NOOP, b""))

    def _set_role(self, role: int) -> None:
        self.role = role
        self._role_changed = True

    def _check_quorum(self) -> None:
        voters = self.log.config.voters
        active = sum(1 for peer in voters
                     if peer == self.id or (peer in self.progress and self.progress[peer].active))
        for pr in self.progress.values():
            pr.active = False
        if active < len(voters) // 2 + 1:
            self._become_follower(self.term, None)

    # ---------------------------------------------------------- replication

    def _append(self, entry: Entry) -> None:
        self.log.append(entry)
        if not self._unstable:
            self._unstable = entry.index
        if entry.kind == CONFIG:
            self._config_appended()
        if self.role == LEADER:
            self._to_replicate.update(dict.fromkeys(self.progress))

    def _send_appends(self, peer: str) -> None:
        pr = self.progress.get(peer)
        if pr is None:
            return
        log = self.log
        while pr.can_send():
            prev = pr.next - 1
            prev_term = log.term_at(prev)
            if prev_term is None or (prev == 0 and self.snapshot_empty_followers):
                pr.start_snapshot()
                self._ask_chunk(peer, pr, 0, 0)
                return
            entries = log.slice(pr.next, self.max_append_bytes) if prev < log.last_index else []
            if not entries and pr.state == REPLICATE:
                commit = min(pr.match, self.commit)
                if pr.commit_sent < commit:
                    # Only the commit index is news. Sent now rather than with the next
                    # heartbeat: a follower applies (and answers a command forwarded
                    # through it) a heartbeat interval sooner.
                    self._messages.append((peer, Commit(self.group, self.term, commit)))
                    pr.commit_sent = commit
                return
            self._messages.append((peer, AppendEntries(
                self.group, self.term, prev, prev_term, self.commit, entries)))
            pr.commit_sent = self.commit
            if pr.state == PROBE:
                pr.probe_sent = True
            elif entries:
                pr.next = entries[-1].index + 1
                pr.inflight.append(entries[-1].index)

    def _on_append(self, sender: str, m: AppendEntries) -> None:
        if self.role != FOLLOWER:
            self._become_follower(self.term, sender)
        self.leader = sender
        self._elapsed = 0
        log = self.log
        if m.prev_index > log.last_index:
            self._reply(sender, AppendResponse(self.group, self.term, False, m.prev_index,
                                               log.last_index))
            return
        entries = m.entries
        prev = m.prev_index
        if prev < log.snapshot_index:
            # The compacted prefix is committed, so it matches the leader's.
            entries = entries[log.snapshot_index - prev:]
            prev = log.snapshot_index
        elif log.term_at(prev) != m.prev_term:
            hint = log.find_conflict_hint(prev, m.prev_term)
            self._reply(sender, AppendResponse(self.group, self.term, False, m.prev_index,
                                               hint))
            return
        for i, entry in enumerate(entries):
            index = entry.index
            if index <= log.last_index:
                if log.term_at(index) == entry.term:
                    continue
                assert index > self.commit, "a leader truncates a committed entry"
                log.truncate_after(index - 1)
                self._truncated(index - 1)
            for new in entries[i:]:
                log.append(new)
            if not self._unstable or self._unstable > index:
                self._unstable = index
            self._config_appended()
            break
        last = m.prev_index + len(m.entries)
        if m.commit > self.commit:
            self.commit = max(self.commit, min(m.commit, last))
        self._reply(sender, AppendResponse(self.group, self.term, True, last, 0), last)

    def _truncated(self, index: int) -> None:
        """Entries after `index` are gone: what was on disk after it no longer counts."""
        self.persisted_index = min(self.persisted_index, index)
        for batch in self._batches:
            batch[1] = min(batch[1], index)
        if self._unstable > index + 1:
            self._unstable = index + 1

    def _on_append_response(self, sender: str, pr: Progress, m: AppendResponse) -> None:
        if m.success:
            if pr.acknowledge(m.index):
                if pr.state == PROBE:
                    pr.state = REPLICATE
                    pr.probe_sent = False
                self._maybe_commit()
                if sender == self.transferee:
                    self._maybe_send_timeout_now()
            elif pr.state == PROBE:
                pr.probe_sent = False
            if pr.match < self.log.last_index or pr.commit_sent < min(pr.match, self.commit):
                self._to_replicate[sender] = None
            return
        if m.index <= pr.match or (pr.state == PROBE and m.index != pr.next - 1):
            return  # stale: a refusal of something since acknowledged or re-sent
        pr.become_probe()
        pr.next = max(pr.match + 1, min(m.index, m.hint + 1))
        self._to_replicate[sender] = None

    def _maybe_commit(self) -> None:
        voters = self.log.config.voters
        matches = sorted(
            (self.persisted_index if peer == self.id
             else self.progress[peer].match if peer in self.progress else 0)
            for peer in voters)
        if not matches:
            return
        index = matches[(len(matches) - 1) // 2]
        if index <= self.commit or self.log.term_at(index) != self.term:
            return
        self.commit = index
        self._to_replicate.update(dict.fromkeys(self.progress))  # tell the followers
        if not self._committed_in_term:
            self._committed_in_term = True
        if self.id not in voters and self.log.pending_config_index() <= index:
            # Removed: it led until its removal committed, now a new leader takes over.
            self._become_follower(self.term, None)

    # ---------------------------------------------------- heartbeats, reads

    def _broadcast_heartbeat(self) -> None:
        for peer, pr in self.progress.items():
            commit = min(pr.match, self.commit)
            pr.commit_sent = max(pr.commit_sent, commit)
            self._messages.append((peer, Heartbeat(
                self.group, self.term, commit, self._heartbeat_seq)))

    def _on_heartbeat(self, sender: str, m: Heartbeat) -> None:
        self._on_commit(sender, m.commit)
        self._reply(sender, HeartbeatResponse(self.group, self.term, m.seq))

    def _on_commit(self, sender: str, commit: int) -> None:
        """A heartbeat's or a commit notice's index: the leader caps it at what this
        server is known to match, so every entry up to it is the leader's."""
        if self.role != FOLLOWER:
            self._become_follower(self.term, sender)
        self.leader = sender
        self._elapsed = 0
        if commit > self.commit:
            self.commit = min(commit, self.log.last_index)

    def _on_heartbeat_response(self, sender: str, pr: Progress, m: HeartbeatResponse) -> None:
        if m.seq > pr.heartbeat_seq:
            pr.heartbeat_seq = m.seq
            self._release_reads()
        if pr.state == PROBE:
            pr.probe_sent = False  # a lost probe or its lost answer: probe again
        if pr.match < self.log.last_index:
            self._to_replicate[sender] = None

    def _confirm_reads(self) -> None:
        self._heartbeat_seq += 1
        seq = self._heartbeat_seq
        self._reads.extend((context, self.commit, seq) for context in self._reads_unconfirmed)
        self._reads_unconfirmed.clear()
        self._broadcast_heartbeat()
        self._release_reads()

    def _release_reads(self) -> None:
        voters = self.log.config.voters
        quorum = len(voters) // 2 + 1
        reads = self._reads
        while reads:
            context, index, seq = reads[0]
            acks = sum(1 for peer in voters if peer == self.id or (
                peer in self.progress and self.progress[peer].heartbeat_seq >= seq))
            if acks < quorum:
                return
            reads.popleft()
            self._reads_ready.append((context, index))

    # ------------------------------------------------------------ snapshots

    def _on_snapshot(self, sender: str, m: InstallSnapshot) -> None:
        if self.role != FOLLOWER:
            self._become_follower(self.term, sender)
        self.leader = sender
        self._elapsed = 0
        if m.index <= self.commit:
            # Already have it (committed entries match the leader's).
            self._reply(sender, SnapshotResponse(self.group, self.term, m.index, 0, True),
                        m.index)
            return
        index, term, expected = self._receiving
        if (index, term) != (m.index, m.snapshot_term) or m.offset != expected:
            if m.offset != 0:
                resume = expected if (index, term) == (m.index, m.snapshot_term) else 0
                self._reply(sender, SnapshotResponse(self.group, self.term, m.index, resume,
                                                     False))
                return
            expected = 0
        self._chunks.append(SnapshotChunk(m.index, m.snapshot_term, m.config, m.offset, m.data,
                                          m.done))
        self._receiving = (m.index, m.snapshot_term, expected + len(m.data))
        self._chunk_from = sender  # answered in chunk_stored, once the machine has it

    def chunk_stored(self, chunk: SnapshotChunk, ok: bool, resume: int | None = None) -> None:
        """The shell's answer for each chunk `ready()` handed over: the state machine stored
        it (with `done`: installed the snapshot), or its storage failed (no space). Only a
        stored chunk is acknowledged, and only an installed snapshot replaces the log: a
        failed one is forgotten unanswered, and the leader starts the transfer over once it
        times out (a backoff while the disk stays full). `resume`: the state machine wants
        the transfer to go on from this offset rather than after the chunk: further on (it
        holds what comes next from an earlier transfer: files it kept) or back (a file
        failed its checksum and is fetched again); a chunk with `done` is then not
        installed."""
        sender = self._chunk_from
        if not ok:
            self._receiving = (0, 0, 0)
            return
        if resume is not None:
            self._receiving = (chunk.index, chunk.term, resume)
            self._reply(sender, SnapshotResponse(self.group, self.term, chunk.index, resume,
                                                 False))
            return
        if not chunk.done:
            self._reply(sender, SnapshotResponse(self.group, self.term, chunk.index,
                                                 chunk.offset + len(chunk.data), False))
            return
        self._receiving = (0, 0, 0)
        self._install(sender, chunk)

    def _install(self, sender: str, m: SnapshotChunk) -> None:
        self.log.restore(m.index, m.term, m.config)
        self._truncated(min(self.persisted_index, m.index))
        if self._unstable and self._unstable <= m.index:
            self._unstable = 0 if self.log.last_index == m.index else m.index + 1
        self.commit = self.applied_index = self._handed = m.index
        self._snapshot = SnapshotMeta(m.index, m.term, m.config)
        self._config_appended()
        self._reply(sender, SnapshotResponse(self.group, self.term, m.index, 0, True), m.index)

    def _on_snapshot_response(self, sender: str, pr: Progress, m: SnapshotResponse) -> None:
        if m.done and pr.state != REPLICATE and (m.index > pr.match
                                                 or m.index == pr.snapshot_index):
            # Installed: also one whose answer came after the transfer timed out (a follower
            # installing a large snapshot holds its loop longer than an election timeout),
            # rather than sending it all again. (A snapshot holds committed entries only.)
            pr.acknowledge(m.index)
            pr.become_probe()
            self._maybe_commit()
            self._to_replicate[sender] = None
            return
        if pr.state != SNAPSHOT or m.index != pr.snapshot_index or m.done:
            return
        pr.snapshot_ticks = 0
        sent = pr.snapshot_sent
        if m.offset in sent:  # the follower stored the chunks up to there
            while sent.popleft() != m.offset:
                pass
            pr.snapshot_resumed = -1
            self._ask_next_chunk(sender, pr)
        elif m.offset != pr.snapshot_resumed:
            # It goes on from elsewhere (past files it holds, back to one that failed its
            # checksum, or it missed a chunk): what is in flight is refused, sent again
            # from there.
            sent.clear()
            pr.snapshot_resumed = pr.snapshot_end = m.offset
            pr.snapshot_last_sent = False
            self._ask_chunk(sender, pr, m.index, m.offset)

    def _ask_next_chunk(self, peer: str, pr: Progress) -> None:
        """Asks for the chunk after the last one sent while fewer than SNAPSHOT_WINDOW are
        unacknowledged: the machine reads the next chunk while the follower stores this one."""
        if (pr.snapshot_asked < 0 and not pr.snapshot_last_sent
                and len(pr.snapshot_sent) < SNAPSHOT_WINDOW):
            self._ask_chunk(peer, pr, pr.snapshot_index, pr.snapshot_end)

    def _ask_chunk(self, peer: str, pr: Progress, index: int, offset: int) -> None:
        pr.snapshot_asked = offset
        self._snapshot_requests.append(SnapshotRequest(peer, index, offset))

    def _tick_snapshots(self) -> None:
        for peer, pr in self.progress.items():
            if pr.state == SNAPSHOT:
                pr.snapshot_ticks += 1
                if pr.snapshot_ticks > self.election_ticks:
                    # A chunk or its answer was lost: start over.
                    pr.become_probe()
                    self._to_replicate[peer] = None

    # --------------------------------------------------------- membership

    def _config_change_allowed(self) -> Config:
        if self.role != LEADER:
            raise NotLeader(self.leader)
        if self.transferee is not None:
            raise ConfigChangeRefused("a leadership transfer is in progress")
        if not self._committed_in_term or self.log.pending_config_index() > self.commit:
            raise ConfigChangeRefused("a configuration change is in progress")
        return self.log.config

    def _change_config(self, config: Config) -> int:
        index = self.log.last_index + 1
        self._append(Entry(index, self.term, CONFIG, config.encode()))
        return index

    def _config_appended(self) -> None:
        """The configuration at the end of the log holds from now on."""
        if self.role != LEADER:
            return
        members = self.log.config.members()
        for peer in sorted(members):
            if peer != self.id and peer not in self.progress:
                self.progress[peer] = Progress(self.log.last_index + 1)
                self._to_replicate[peer] = None
        for peer in list(self.progress):
            if peer not in members:
                del self.progress[peer]
        if self.transferee is not None and self.transferee not in self.log.config.voters:
            self._end_transfer()
        self._maybe_commit()

    # ------------------------------------------------------------- replies

    def _reply(self, to: str, message: Message, durable_index: int = 0) -> None:
        """Sends at once when nothing it says waits for the disk, else after the next
        fsync: a vote or an acknowledgement promises state that must survive a crash."""
        if (durable_index <= self.persisted_index
                and self._durable == HardState(self.term, self.vote)):
            self._messages.append((to, message))
        else:
            self._after_persist.append((to, message))
