"""Durable Storage on Raft (`durable_storage.messages.backend = builtin_raft`): the
`sessions` database and every shard of `messages` as Raft groups, hosted next to the
metadata group on the node's one write-ahead log and the cluster links.

- Groups: `sessions` is group 1, shard i of `messages` is group 16 + i. They are created
  with the metadata group and belong to its incarnation (its epoch): a node that bootstraps
  the metadata group bootstraps these with the first `replication_factor` of its voters; a
  node that joins hosts them as a server waiting to be added, once their leader reaches it.
- Membership: each group's leader follows the cluster's member list as the metadata group
  does, with at most `replication_factor` voters; every other node is a learner, so every
  node holds a full replica and serves its durable sessions from local reads.
- Writes: a shard's write buffer flush is one STORE command, proposed here when this node
  leads the shard, else forwarded to its leader; it returns once committed and applied here
  (a durable session on this node sees what the PUBACK says is stored). A write not
  committed within `durable_storage.raft.commit_timeout` fails: its PUBLISHes are not
  acknowledged and their connections close, so the clients resend, perhaps to the
  majority's side. Generations start and end through the log (ROTATE, DROP); timers
  propose them only on the shard's leader.
- Truncation: once `durable_storage.raft.snapshot_interval` entries (or a segment's worth of
  bytes) were applied since the last time, LevelDB is synced and the log compacted up to it;
  a replica that needs compacted entries gets a snapshot (broker/ds/replication_shard.py).
"""

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, Final

from broker.cluster import ds_replicas
from broker.cluster.bootstrap import GroupRecord
from broker.cluster.group_members import NO_TARGET
from broker.cluster.metadata import MetadataGroup
from broker.cluster.peer_applied import PeersApplied
from broker.cluster.placement import Placement, Target
from broker.cluster.proposer import CommitTimeout
from broker.config.loader import Config
from broker.ds import DurableStorage
from broker.ds import replication_layer as cmd
from broker.ds.replication_shard import Admit, KVMachine, OnWrites, SessionsOf, ShardMachine
from broker.ds.shard import now_us
from broker.ds.ttv import TTV
from broker.raft.core import LEADER, ROLE_NAMES
from broker.raft.node import RaftNode
from broker.raft.spool import Pace
from broker.stats import Sample

log = logging.getLogger(__name__)

SESSIONS_GROUP: Final = 1
SHARD_GROUP_BASE: Final = 16

Machine = ShardMachine | KVMachine


def shard_group(shard: int) -> int:
    return SHARD_GROUP_BASE + shard


def _shard_of(group: int) -> int | None:
    """The `messages` shard a group holds; None for `sessions`."""
    return None if group == SESSIONS_GROUP else group - SHARD_GROUP_BASE


class WritesRefused(Exception):
    """A sessions command of this node was committed and refused whole: it did not follow
    this node's chain (replication_layer.py), as one before it timed out and was applied
    after all."""


class DsGroups:
    def __init__(self, config: Config, ds: DurableStorage, metadata: MetadataGroup,
                 on_session_writes: OnWrites,
                 admit: Admit, on_refused: Callable[[set[str]], None],
                 sessions_of: SessionsOf, ship_files: Callable[[], bool]) -> None:
        self._ds = ds
        self._metadata = metadata
        self.me = metadata.me
        self.replication_factor: int = config["durable_storage.messages.replication_factor"]
        self._timeout: float = config["durable_storage.raft.commit_timeout"]
        self._snapshot_interval: int = config["durable_storage.raft.snapshot_interval"]
        self._segment_bytes: int = config["durable_storage.raft.wal_max_size_bytes"]
        # Snapshot chunks of every group leave at this node's one byte rate.
        pace = Pace(config["durable_storage.raft.snapshot_bytes_rate"])
        self._sessions = KVMachine(ds.sessions, on_session_writes, admit, self.me, on_refused,
                                   sessions_of, pace)
        self.machines: dict[int, Machine] = {SESSIONS_GROUP: self._sessions}
        ds.messages.create()  # side by side, before each machine needs its own
        for shard in ds.messages.created_shards:
            self.machines[shard_group(shard.index)] = ShardMachine(
                ds.messages, shard.index, ds.messages.reopen_shard, ship_files, pace)
            shard.replication = self
        ds.sessions.replicate = self._store_sessions
        # Replicated, a flush of the sessions database is a Raft commit on every replica:
        # writes that need no fsync wait to share one.
        ds.sessions.buffer.pace(config["durable_sessions.checkpoint_interval"])
        self._serials: dict[int, int] = {}  # shard -> this node's last STORE serial
        self._kv_serial = 0  # this node's last sessions command's serial (0: none yet)
        self._raft: RaftNode | None = None
        # The operator's placement file, when there is one (set by the app's watcher).
        self.placement: Placement | None = None
        self._stopping = False
        # The tasks waiting for a commit -> whether `stop` cancelled it.
        self._committing: dict[asyncio.Task[Any], bool] = {}
        self.timed_out = 0
        metadata.hosted.append(self)

    # ---- hosting (HostedGroups) ------------------------------------------------------------
    def host(self, raft: RaftNode, record: GroupRecord) -> None:
        self._raft = raft
        voters = frozenset(sorted(record.voters)[:self.replication_factor])
        for group in self.machines:
            self._add(group, voters if self.me in voters else frozenset())

    def adopt(self, group: int) -> bool:
        if group not in self.machines or self._raft is None:
            return False
        self._add(group, frozenset())
        return True

    def _add(self, group: int, voters: frozenset[str]) -> None:
        raft = self._raft
        assert raft is not None
        if group in raft.host.groups:
            return
        machine = self.machines[group]
        machine.spool.on_dumped = functools.partial(raft.snapshot_ready, group)
        raft.add_group(group, machine, voters, machine.applied_index, machine.snapshot())

    def round(self) -> None:
        raft = self._raft
        if raft is None:
            return
        joined = self._metadata.joined
        for group, machine in self.machines.items():
            if group not in raft.host.groups:
                continue
            core = raft.core(group)
            if isinstance(machine, ShardMachine):
                # A new replica gets the sealed generations as files, not the log's entries.
                core.snapshot_empty_followers = machine.ships_sealed()
            if core.role == LEADER and joined:
                self._metadata.change_membership(core, self._name(group),
                                                 self.replication_factor, self._target(group))
            if (machine.applied_index - machine.flushed_index >= self._snapshot_interval
                    or machine.unflushed_bytes >= self._segment_bytes):
                raft.compact(group, machine.flush())
            else:
                machine.spool.drop_idle()

    def _target(self, group: int) -> Target:
        members = self._metadata.member_sites()
        placement = self.placement
        if placement is not None:
            return placement.target(_shard_of(group), members)
        if _shard_of(group) is None:
            return NO_TARGET
        return ds_replicas.target(self._chosen(), members)

    # ---- the administrator's replica sites (broker ctl ds join|leave|set-replicas) ----------
    def _chosen(self) -> frozenset[str] | None:
        return ds_replicas.decode(self._ds.sessions.get(ds_replicas.KEY))

    def replicas(self) -> list[str]:
        return ds_replicas.replicas(self._chosen(), self._metadata.member_sites())

    async def change_replicas(self, change: Callable[[frozenset[str] | None, set[str]],
                                                     frozenset[str]]) -> list[str]:
        """Commits `change(current choice, members)` (which raises ReplicasRefused for a
        request it cannot carry out) and returns the sites that may now vote."""
        if self.placement is not None:
            raise ds_replicas.ReplicasRefused(
                "the operator's placement file decides where the shards are"
                " (durable_storage.messages.placement_file): change the MQTTCluster instead")
        chosen = change(self._chosen(), self._metadata.member_sites())
        await self._ds.sessions.write_soon({ds_replicas.KEY: ds_replicas.encode(chosen)})
        return self.replicas()

    @staticmethod
    def _name(group: int) -> str:
        shard = _shard_of(group)
        return "sessions" if shard is None else f"messages shard {shard}"

    def leads(self, shard: int | None) -> bool:
        """Whether this node leads the shard's group (None: the `sessions` group's)."""
        core = self._metadata.core(SESSIONS_GROUP if shard is None else shard_group(shard))
        return core is not None and core.role == LEADER

    def is_up(self, site: str) -> bool:
        return self._metadata.is_up(site)

    # ---- writes (Replication, for the shards) ------------------------------------------------
    async def store(self, shard: int, messages: list[TTV]) -> None:
        clock = now_us()
        # The serial must grow across restarts too: the clock's microseconds do.
        serial = self._serials[shard] = max(self._serials.get(shard, 0) + 1, clock)
        data = cmd.encode_store(clock, self.me, serial, messages)
        group = shard_group(shard)
        machine = self.machines[group]
        await self._commit(group, data, lambda: machine.proposing(data, messages))

    async def rotate(self, shard: int) -> None:
        await self._commit(shard_group(shard), cmd.encode_rotate(now_us()))

    async def load(self, shard: int, command: bytes) -> None:
        """A LOAD command (a chunk of a generation restored from a backup: broker/backup)."""
        await self._commit(shard_group(shard), command)

    async def drop(self, shard: int, cutoff: int) -> None:
        await self._commit(shard_group(shard), cmd.encode_drop(cutoff))

    async def _store_sessions(self, writes: list[cmd.KVWrite]) -> None:
        """One command of this node's chain. A session whose writes did not commit, or
        were refused, leaves this node: what it sent and holds in memory is ahead of what
        the replicas will ever hold, and its client resumes it from them."""
        sessions = self._sessions
        # The first command since start begins the chain again (this replica may not have
        # applied the last ones of before yet); each next one follows the last applied.
        prev = sessions.chains.get(self.me, 0) if self._kv_serial else 0
        serial = self._kv_serial = max(self._kv_serial + 1, now_us())
        try:
            await self._commit(SESSIONS_GROUP, cmd.encode_kv(self.me, serial, prev, writes))
        except CommitTimeout:
            if not self._stopping:
                sessions.lost(writes)
            raise
        if sessions.refused_serial == serial:
            raise WritesRefused(f"sessions command {serial} does not follow {prev}")

    async def _commit(self, group: int, data: bytes,
                      proposing: Callable[[], None] | None = None) -> None:
        if self._stopping:
            raise CommitTimeout("the node is stopping")
        # Awaited in the caller's task, not a task of its own: a commit is on the path of
        # every durable PUBLISH, and a task costs two more turns of a busy event loop.
        task = asyncio.current_task()
        assert task is not None
        self._committing[task] = False
        try:
            async with asyncio.timeout(self._timeout):
                await self._metadata.commit(group, data, proposing)
        except TimeoutError:
            self.timed_out += 1
            raise CommitTimeout(
                f"{self._name(group)}: not committed within {self._timeout:g} s (no leader"
                " reachable: this node is on a minority's side?)") from None
        except asyncio.CancelledError:
            if self._committing.get(task):
                task.uncancel()
                raise CommitTimeout("the node is stopping") from None
            raise
        finally:
            self._committing.pop(task, None)

    async def sessions_seen(self, peers: PeersApplied) -> None:
        """Returns once the nodes this one reaches applied what it applied of `sessions`
        (bounded): a durable SUBACK's subscription is then stored for everywhere."""
        await peers.everywhere(SESSIONS_GROUP, self._sessions.applied_index)

    async def sync(self, sessions: bool = True) -> bool:
        """True once this node's replicas hold everything committed before the call, in
        `sessions` (unless `sessions` is False: a caller that just committed there) and in
        every shard (a barrier committed through each group's log and applied here), so a
        session that moves here finds its state and the messages its in-flight window
        names; False after the commit timeout (a replica may be behind: this node is cut
        off from a majority)."""
        groups = [group for group in self.machines if sessions or group != SESSIONS_GROUP]
        try:
            async with asyncio.timeout(self._timeout):
                await asyncio.gather(*(self._metadata.commit(group, cmd.BARRIER_COMMAND)
                                       for group in groups))
        except TimeoutError:
            log.warning("Durable Storage: a barrier not committed within %g s; this node's"
                        " replicas may be behind", self._timeout)
            return False
        return True

    async def sessions_barrier(self) -> bool:
        """True once this node's replica of `sessions` holds everything committed before the
        call; False after the commit timeout."""
        return await self._barrier(SESSIONS_GROUP)

    async def shard_barrier(self, shard: int) -> bool:
        """True once this node's replica of the messages shard holds everything committed
        before the call; False after the commit timeout."""
        return await self._barrier(shard_group(shard))

    async def _barrier(self, group: int) -> bool:
        try:
            async with asyncio.timeout(self._timeout):
                await self._metadata.commit(group, cmd.BARRIER_COMMAND)
        except (TimeoutError, CommitTimeout):
            return False
        return True

    def stop(self) -> None:
        """Writes fail at once from now on, and so do those waiting for a commit (the
        links go down: none could commit), or closing the storage would wait for each until
        its commit timeout: a drained node, in no group any more, for ever. A snapshot dump
        under way ends here, before the storage closes the databases it reads."""
        self._stopping = True
        for machine in self.machines.values():
            machine.spool.end_dump(for_good=True)  # before the storage closes what it reads
        for task, stopped in list(self._committing.items()):
            if not stopped:
                self._committing[task] = True
                task.cancel()

    def forget(self, site: str) -> str:
        """`broker ctl ds forget SITE`: a site whose node and data are gone for good stops
        counting as a replica now rather than after `cluster.autoclean`, so the groups it
        voted in regain their full fault tolerance. Refused for a site that is up (its
        data is not gone: `leave` moves its votes away) and for this node's own."""
        site = ds_replicas.spell(site, self._metadata.member_sites())
        if site == self.me:
            raise ds_replicas.ReplicasRefused("a node cannot forget its own site")
        if self._metadata.is_up(site):
            raise ds_replicas.ReplicasRefused(
                f"site {site} is up: forget only a site that is gone for good (to move its"
                f" votes away, `broker ctl ds leave messages {site}`)")
        self._metadata.forget(site)
        return site

    # ---- observability --------------------------------------------------------------------
    def sites(self) -> list[str]:
        return sorted(self._metadata.member_sites())

    async def site(self, site: str) -> dict[str, Any] | None:
        """`GET /api/v5/ds/sites/{site}` in EMQX's shape, from each group's configuration
        as its leader knows it: a site holds a shard where it votes (a learner's copy only
        serves local reads and is not counted, as the operator's drain asks about the
        replicas the placement names); `transition` "leaving" for a vote the placement
        takes away. None for a site that is not a member."""
        try:
            site = ds_replicas.spell(site, self._metadata.member_sites())
        except ds_replicas.ReplicasRefused:
            return None
        shards: list[dict[str, Any]] = []
        voters = await self._metadata.leaders_voters(list(self.machines))
        for group, sites in sorted(voters.items()):
            if site not in sites:
                continue
            shard = _shard_of(group)
            entry: dict[str, Any] = {"storage": "sessions" if shard is None else "messages",
                                     "id": str(shard or 0), "status": "up"}
            target = self._target(group)
            if site in target.excluded or (target.voters is not None
                                           and site not in target.voters):
                entry["transition"] = "leaving"
            shards.append(entry)
        return {"site": site, "node": self._metadata.name_of(site),
                "up": self._metadata.is_up(site), "shards": shards}

    def metrics(self) -> list[Sample]:
        sessions = self._sessions
        return [
            ("mqtt_durable_session_writes_refused", "counter",
             "Commands' writes to a durable session this replica refused (one per session and"
             " command): their node did not own it any more (claimed elsewhere, or ended)", {},
             float(sessions.refused_writes)),
            ("mqtt_durable_session_chain_breaks", "counter",
             "Sessions commands this replica refused whole: what they followed of their"
             " node's earlier commands was never applied (one of those timed out)", {},
             float(sessions.chain_breaks)),
            ("mqtt_durable_commit_timeouts", "counter",
             "Durable Storage commands of this node not committed within"
             " durable_storage.raft.commit_timeout", {}, float(self.timed_out)),
        ]

    def status(self) -> list[dict[str, Any]]:
        raft = self._raft
        groups = []
        for group in self.machines:
            if raft is None or group not in raft.host.groups:
                continue
            core = raft.core(group)
            config = core.log.config
            groups.append({
                "id": group, "name": self._name(group), "role": ROLE_NAMES[core.role],
                "leader": core.leader, "term": core.term, "commit": core.commit,
                "applied": core.applied_index, "voters": sorted(config.voters),
                "learners": sorted(config.learners)})
        return groups

