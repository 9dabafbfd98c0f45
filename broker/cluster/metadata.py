"""The metadata Raft group (group 0), hosted by every node: today it holds the retained
messages; its asyncio shell lives here.

- Bootstrap (broker/cluster/bootstrap.py): `durable_storage.n_sites` running members before
  a group is created, the choice saved in `<data_dir>/raft/metadata.json` (a restart reuses
  it); the RPCs `raft_prepare`, `raft_decided` and `raft_status` carry the two-phase exchange
  (broker/cluster/bootstrap_exchange.py).
- Membership (broker/cluster/group_members.py): the leader follows the cluster's member list,
  one change per maintenance round.
- Writes (broker/cluster/proposer.py): retained messages become batched commands, proposed
  here when this node leads, else forwarded to the leader (RPC `raft_propose`, which answers
  once committed); the caller's future resolves once the entry is committed and (within the
  attempt's time) applied here too, so a subscriber on this node sees what its PUBACK said.
- Reads: every node applies the log to its own RetainedStore (broker/retainer/machine.py).
- Truncation: once `durable_storage.raft.snapshot_interval` entries were applied since the
  last time, the store is flushed (one synced LevelDB write) and the log compacted up to it.
- Join: `after_join` discards this node's group, Raft log and retained messages when the
  cluster it joined has another group (as EMQX's `cluster join` wipes the joining node); the
  node then adopts the cluster's group when its leader adds it.
"""

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Final, Protocol

from broker.cluster import group_members
from broker.cluster.bootstrap import GroupRecord
from broker.cluster.bootstrap_exchange import BootstrapExchange
from broker.cluster.placement import Target
from broker.cluster.proposer import Batch, Proposer
from broker.cluster.raft_transport import RaftTransport
from broker.cluster.rpc import Rpc, RpcError
from broker.cluster.service import Cluster
from broker.config.loader import Config
from broker.format_check import trees
from broker.raft.core import LEADER, ROLE_NAMES, ConfigChangeRefused, NotLeader, RaftGroup
from broker.raft.host import Sample
from broker.raft.node import CommandLost, RaftNode
from broker.raft.wal import SUFFIX as WAL_SUFFIX
from broker.retainer.machine import RetainedMachine
from broker.retainer.store import RetainedStore, encode_record
from broker.session.message import Message

log = logging.getLogger(__name__)

GROUP: Final = 0


class HostedGroups(Protocol):
    """Groups hosted on the metadata group's log, links and incarnation."""

    def host(self, raft: RaftNode, record: GroupRecord) -> None:
        """The metadata group is hosted now (created, joined or restarted)."""

    def adopt(self, group: int) -> bool:
        """Traffic for `group`, not hosted yet: host it (as a server waiting to be added),
        if it is one of these."""

    def round(self) -> None:
        """Maintenance, a few times per election timeout."""

    def status(self) -> list[dict[str, Any]]:
        """Their entries in `GET /api/v5/raft`."""


class MetadataGroup:
    def __init__(self, config: Config, cluster: Cluster, rpc: Rpc, store: RetainedStore,
                 refused: Callable[[int], None],
                 can_transfer_to: Callable[[str], bool] = lambda site: True) -> None:
        self._cluster = cluster
        # Whether a site's node may be handed a group's leadership (TimeoutNow is new since
        # 0.1.0): the cluster's versions decide.
        self.can_transfer_to = can_transfer_to
        self._rpc = rpc
        self.me = cluster.me.site
        self._wal_dir = trees(config)[1]  # where the start-up format check looked
        self._segment_bytes: int = config["durable_storage.raft.wal_max_size_bytes"]
        self._snapshot_interval: int = config["durable_storage.raft.snapshot_interval"]
        heartbeat: float = config["durable_storage.raft.heartbeat_interval"]
        self._tick = heartbeat / 2
        self._election_ticks = max(3, round(config["durable_storage.raft.election_timeout"]
                                            / self._tick))
        # One attempt (a proposal, a forward) may take a few elections before it is retried.
        self._attempt_timeout = 4 * self._election_ticks * self._tick
        self._store = store
        self._refused = refused
        self.machine = RetainedMachine(store, refused)
        self._exchange = BootstrapExchange(
            cluster, rpc, Path(config["node.data_dir"]) / "raft",
            config["durable_storage.n_sites"], self._attempt_timeout, self._spawn,
            self._create, self._created_by_coordinator, self.name_of)
        self.bootstrap = self._exchange.bootstrap
        self.transport = RaftTransport(cluster, self.epoch_of, self._deliver)
        self.proposer = Proposer(self._submit, config["durable_storage.raft.commit_timeout"])
        self.foreign_frames = 0  # Raft traffic of another incarnation of the group, dropped
        self._foreign_seen: set[tuple[str, int]] = set()
        self._raft: RaftNode | None = None
        # Told when the node's Raft log or a state machine cannot write (the error) and can
        # again (None); `room` says when the machines' storage may be reopened (RaftNode).
        self.on_disk: Callable[[BaseException | None], object] = lambda error: None
        self.room: Callable[[], bool] = lambda: True
        self._task: asyncio.Task[None] | None = None
        self._jobs: set[asyncio.Task[None]] = set()
        self._links_changed = asyncio.Event()
        self._peer_came = asyncio.Event()  # a link came up: a maintenance round at once
        self._changed = False  # the round under way changed a group's membership
        # More groups on this node's log and links, created with the metadata group
        # (Durable Storage's, broker/cluster/ds_groups.py).
        self.hosted: list[HostedGroups] = []
        cluster.on_peer_up(self._link_changed)
        cluster.on_peer_up(lambda site: self._peer_came.set())
        cluster.on_peer_down(self._link_changed)
        cluster.on_peer_closed(self._peer_closed)
        cluster.group_sites = self._group_sites
        for name, method in (("raft_propose", self._rpc_propose),
                             ("raft_epoch", self._rpc_epoch),
                             ("raft_voters", self._rpc_voters)):
            rpc.register(name, method)

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._raft = self._open()
        if self.bootstrap.record is not None:
            self._host(self.bootstrap.record)
        self.proposer.start()
        self._task = asyncio.get_running_loop().create_task(self._maintain())

    async def stop(self) -> None:
        """Flushes what was applied (a restart replays less) and closes the log."""
        for task in (self._task, *self._jobs):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.proposer.stop()
        self.machine.spool.end_dump(for_good=True)  # before the store closes
        if self._raft is not None:
            self.machine.flush()
            await self._raft.close()

    def balance_leaders(self) -> None:
        """A round of durable_storage.raft.leader_balance_interval (see RaftNode)."""
        if self._raft is not None:
            self._raft.balance_leaders()

    async def hand_over(self, timeout: float) -> tuple[list[int], list[int]]:
        """A graceful stop: see RaftNode.hand_over (every group of this node is on it)."""
        return ([], []) if self._raft is None else await self._raft.hand_over(timeout)

    def _open(self) -> RaftNode:
        if self.bootstrap.record is None and self._wal_dir.is_dir():
            # A node that is no member has no Raft history: whatever a log holds is of a
            # group it left or never finished joining. (Its segments only: the directory
            # is the operator's.)
            for segment in self._wal_dir.glob("*" + WAL_SUFFIX):
                segment.unlink()
        raft = RaftNode(self.me, str(self._wal_dir), self.transport,
                        tick_seconds=self._tick, election_ticks=self._election_ticks,
                        heartbeat_ticks=2, segment_bytes=self._segment_bytes,
                        can_transfer_to=lambda site: self.is_up(site)
                        and self.can_transfer_to(site))
        raft.on_disk = lambda error: self.on_disk(error)
        raft.room = lambda: self.room()
        return raft

    def _reset_machine(self) -> None:
        """This node's retained messages are not the group's: they go, with the machine
        that held them (and its snapshot dump, if one is under way)."""
        self.machine.spool.end_dump(for_good=True)
        self._store.clear()
        self.machine = RetainedMachine(self._store, self._refused)

    def _host(self, record: GroupRecord) -> None:
        assert self._raft is not None
        self.machine.spool.on_dumped = functools.partial(self._raft.snapshot_ready, GROUP)
        self._raft.add_group(GROUP, self.machine, frozenset(record.voters),
                             self.machine.applied_index, self.machine.snapshot())
        for hosted in self.hosted:
            hosted.host(self._raft, record)

    def _group_sites(self) -> set[str]:
        """Every site a group hosted here has as a member."""
        raft = self._raft
        if raft is None:
            return set()
        return {site for group in raft.host.groups
                for site in raft.core(group).log.config.members()}

    def core(self, group: int = GROUP) -> RaftGroup | None:
        raft = self._raft
        if raft is None or group not in raft.host.groups:
            return None
        return raft.core(group)

    @property
    def joined(self) -> bool:
        return self._cluster.joined

    # ---- writes --------------------------------------------------------------------------
    def write_retained(self, message: Message) -> "asyncio.Future[None]":
        """Sets (or, with an empty payload, clears) a retained message through the log;
        this node shows it at once (RetainedStore.hold) until its batch is settled."""
        store = self._store
        store.hold(message)
        batch = self.proposer.add(encode_record(message))
        if not batch.messages:
            batch.future.add_done_callback(
                lambda _: store.release(*(held.topic for held in batch.messages)))
        batch.messages.append(message)
        return batch.future

    async def _submit(self, batch: Batch, data: bytes) -> None:
        messages = list(zip(batch.messages, batch.commands, strict=True))
        await self.commit(GROUP, data, lambda: self.machine.proposing(data, messages))

    async def commit(self, group: int, data: bytes,
                     proposing: Callable[[], None] | None = None) -> None:
        """Until `data` is committed in `group` and applied here (the caller bounds the
        wait): proposes when this node leads (after `proposing()`), else forwards to the
        leader, else waits for one."""
        while True:
            raft, core, leader = self._raft, self.core(group), self._leader(group)
            if raft is None or core is None or leader is None:
                await self._until(lambda: self._has_leader(group), self._attempt_timeout)
                continue
            try:
                if leader == self.me:
                    if proposing is not None:
                        proposing()
                    async with asyncio.timeout(self._attempt_timeout):
                        await raft.propose(group, data)
                    return
                index = await self._rpc.call(
                    leader, "raft_propose", {"group": group, "epoch": self.epoch_of(group)},
                    timeout=self._attempt_timeout, body=data)
                # Committed: retrying now would store it twice. Shown here once applied,
                # however long this node's replica lags (the caller bounds the wait).
                applied = self._applied(group, index)
                while not applied():
                    await self._until(applied, self._attempt_timeout)
                return
            except (NotLeader, CommandLost, RpcError, TimeoutError) as error:
                log.debug("group %d: command not committed yet (%s): retrying", group, error)
                # Once the leader changes (a crashed one's link closed: an election at
                # once), at most a tick: a retry need not wait out a fixed pause.
                await self._until(functools.partial(self._led_by_other, group, leader),
                                  self._tick)

    def _leader(self, group: int) -> str | None:
        core = self.core(group)
        return core.leader if core is not None else None

    def _led_by_other(self, group: int, leader: str) -> bool:
        return self._leader(group) != leader

    def _has_leader(self, group: int = GROUP) -> bool:
        return self._leader(group) is not None

    def _applied(self, group: int, index: int) -> Callable[[], bool]:
        def applied() -> bool:
            core = self.core(group)
            return core is not None and core.applied_index >= index
        return applied

    async def until_applied(self, group: int, index: int, timeout: float) -> int:
        """This node's applied index of `group`, once at `index` or after `timeout`."""
        await self._until(self._applied(group, index), timeout)
        core = self.core(group)
        return core.applied_index if core is not None else 0

    async def _until(self, condition: Callable[[], bool], timeout: float) -> None:
        """Returns when `condition` holds or after `timeout`, whichever comes first."""
        raft = self._raft
        assert raft is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await raft.wait(condition)

    async def _rpc_propose(self, params: Any) -> int:
        group = int(params.get("group", GROUP))
        if (int(params["epoch"]) != self.epoch_of(group) or self._raft is None
                or self.core(group) is None):
            raise RpcError("not a member of that group")
        return await self._raft.propose(group, params["body"])

    # ---- Raft traffic -------------------------------------------------------------------
    def _link_changed(self, site: str) -> None:
        """What was in flight on the link is lost: Raft must resend it."""
        self._links_changed.set()
        if self._raft is not None:
            self._raft.unreachable(site)

    def _peer_closed(self, site: str) -> None:
        """The peer's end closed the link: the groups it led elect without waiting."""
        if self._raft is not None:
            self._raft.peer_lost(site)

    def epoch_of(self, group: int) -> int:
        """Every group of the node belongs to the metadata group's incarnation."""
        record = self.bootstrap.record
        return record.epoch if record is not None else 0

    def _deliver(self, site: str, group: int, epoch: int, data: bytes) -> None:
        raft = self._raft
        if raft is None:
            return
        record = self.bootstrap.record
        if record is None:
            # Any group's traffic names the incarnation (a Durable Storage group's leader
            # may reach a new site before the metadata group's does: waiting for the latter
            # dropped the first snapshot chunk, and the transfer stalled for its timeout).
            adopted = self.bootstrap.adopt(epoch)
            if adopted is None:
                if group == GROUP:
                    self._foreign(site, epoch)
                return
            log.info("joining the metadata Raft group (epoch %x): traffic from %s", epoch, site)
            if self.machine.unlogged():
                log.warning("discarding %d retained messages stored before this node joined"
                            " the group: the group's are the cluster's", len(self._store))
                self._reset_machine()
            self._exchange.save()
            self._host(adopted)
        elif record.epoch != epoch:
            self._foreign(site, epoch)
            return
        if group != GROUP and group not in raft.host.groups and not any(
                hosted.adopt(group) for hosted in self.hosted):
            return  # not a group of ours (yet): its leader retries
        raft.receive(site, data)

    def _foreign(self, site: str, epoch: int) -> None:
        self.foreign_frames += 1
        if (site, epoch) not in self._foreign_seen:
            self._foreign_seen.add((site, epoch))
            log.warning("peer %s is in another metadata Raft group (epoch %x, ours %x): its"
                        " traffic is ignored. If that node should join this cluster's group,"
                        " run `broker ctl cluster join` on it (its retained messages are"
                        " replaced by the cluster's).", self.name_of(site), epoch,
                        self.epoch_of(GROUP))

    # ---- maintenance ---------------------------------------------------------------------
    def _spawn(self, job: Coroutine[Any, Any, None]) -> "asyncio.Task[None]":
        task = asyncio.get_running_loop().create_task(job)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        return task

    async def _maintain(self) -> None:
        """A few times per election timeout: bootstrap, promises, membership, truncation.
        Membership moves sooner: a round at once when a peer's link comes up, and one a
        tick after a round that changed a group (its change commits within a round trip):
        a site back with a new data dir is removed, then added, then a catch-up starts,
        and that took up to three rounds."""
        interval = self._tick * 4
        wait = interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._peer_came.wait()
            self._peer_came.clear()
            self._changed = False
            try:
                self._round()
            except Exception:
                log.exception("metadata group maintenance failed")
            wait = self._tick if self._changed else interval

    def _round(self) -> None:
        self._exchange.round()
        core = self.core()
        if core is None:
            return
        if core.role == LEADER and self._cluster.joined:
            self.change_membership(core, "metadata")
        for hosted in self.hosted:
            hosted.round()
        machine = self.machine
        if (machine.applied_index - machine.flushed_index >= self._snapshot_interval
                or machine.unflushed_bytes >= self._segment_bytes):
            # (Also by size: the log is kept in memory until it is truncated.)
            assert self._raft is not None
            self._raft.compact(GROUP, machine.flush())

    def member_sites(self) -> set[str]:
        """Every member of the cluster, running or down, this node included."""
        return set(self._cluster.membership.members) | {self.me}

    def change_membership(self, core: RaftGroup, name: str,
                          voter_cap: int = group_members.VOTER_CAP,
                          target: Target = group_members.NO_TARGET) -> None:
        """The next step of a led group towards the cluster's member list (at most
        `voter_cap` voters, the other members learners) and `target`'s voters."""
        members = self._cluster.membership
        caught_up = {site for site, pr in core.progress.items() if core.caught_up(pr)}
        change = group_members.next_change(core.log.config, self.me, set(members.running()),
                                           set(members.members), caught_up, voter_cap,
                                           target)
        if change is None:
            return
        kind, site = change
        raft = self._raft
        assert raft is not None
        make = {group_members.ADD: raft.add_learner, group_members.PROMOTE: raft.promote,
                group_members.REMOVE: raft.remove}[kind]
        try:
            make(core.group, site)
        except (ConfigChangeRefused, NotLeader):
            return  # the previous change has not committed yet: next round
        self._changed = True
        log.info("%s group: %s %s", name, {group_members.ADD: "added learner",
                                           group_members.PROMOTE: "promoted voter",
                                           group_members.REMOVE: "removed"}[kind],
                 self.name_of(site))

    # ---- bootstrap (bootstrap_exchange.py) -----------------------------------------------
    def _create(self, record: GroupRecord) -> None:
        unlogged = self._store.match("#") if self.machine.unlogged() else []
        self._exchange.save()
        self._host(record)
        log.info("created the metadata Raft group (epoch %x), voters %s", record.epoch,
                 ", ".join(self.name_of(site) for site in record.voters))
        for message in unlogged:  # what this node retained before: now the group's
            self.write_retained(message)

    def _created_by_coordinator(self, record: GroupRecord) -> None:
        if self.machine.unlogged():
            self._reset_machine()
        self._exchange.save()
        self._host(record)
        log.info("metadata Raft group created (epoch %x) by its coordinator", record.epoch)

    def _rpc_epoch(self, _params: Any) -> int:
        return self.epoch_of(GROUP)

    # ---- join --------------------------------------------------------------------------
    async def after_join(self, timeout: float = 5.0) -> None:
        """After `broker ctl cluster join`: if the cluster has a metadata group other than
        this node's, this node's group, Raft log and retained messages are discarded and it
        waits to be added to the cluster's (EMQX's join wipes the joining node too)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._linked()
        epochs = {epoch for epoch in (await self._rpc.multicall("raft_epoch")).values()
                  if isinstance(epoch, int) and epoch}
        mine = self.epoch_of(GROUP)
        if epochs and mine not in epochs and self.bootstrap.state != "blank":
            await self._discard("joined a cluster whose metadata group is another")

    async def after_leave(self) -> None:
        """After `broker ctl cluster leave`: the node stands alone, as EMQX's leave resets
        it; the group it left goes on without it (its peers remove it), and this node's
        history of that group is discarded: with `n_sites` 1 it creates a group of its own."""
        if self.bootstrap.state != "blank":
            await self._discard("left the cluster")

    async def _discard(self, why: str) -> None:
        log.warning("%s: discarding this node's metadata group (epoch %x), Raft log and %d"
                    " retained messages", why, self.epoch_of(GROUP), len(self._store))
        await self.proposer.stop()
        self.proposer.abandon()
        if self._raft is not None:
            await self._raft.close()
        self.bootstrap.forget()
        self._exchange.save()
        self._reset_machine()
        self._raft = self._open()
        self.proposer = Proposer(self._submit, self.proposer.timeout)
        self.proposer.start()

    async def _linked(self) -> None:
        while not self._cluster.peers():
            self._links_changed.clear()
            await self._links_changed.wait()

    # ---- observability --------------------------------------------------------------------
    async def leaders_voters(self, groups: list[int]) -> dict[int, frozenset[str]]:
        """Each group's voters as its leader knows them (a removed member never learns of
        its removal: it stops hearing from the group), this node's own view where no
        leader answers within a second."""
        asked: dict[str, list[int]] = {}
        leaderless: list[int] = []
        voters: dict[int, frozenset[str]] = {}
        for group in groups:
            core = self.core(group)
            if core is None:
                continue
            voters[group] = frozenset(core.log.config.voters)
            if core.leader is None:  # a removed node's case: whoever leads answers
                leaderless.append(group)
            elif core.leader != self.me:
                asked.setdefault(core.leader, []).append(group)
        answers: list[Any] = []
        if leaderless:
            answers += (await self._rpc.multicall("raft_voters", leaderless, 1.0)).values()
        for leader, led in asked.items():
            try:
                answers.append(await self._rpc.call(leader, "raft_voters", led, timeout=1.0))
            except RpcError:
                continue
        for answer in answers:
            if isinstance(answer, dict):
                for group, sites in answer.items():
                    voters[int(group)] = frozenset(sites)
        return voters

    def _rpc_voters(self, params: Any) -> dict[str, list[str]]:
        answer = {}
        for group in params:
            core = self.core(int(group))
            if core is not None and core.role == LEADER:
                answer[str(group)] = sorted(core.log.config.voters)
        return answer

    def forget(self, site: str) -> bool:
        """Removes `site` from the cluster on every node that hears; each group's leader
        then removes it from the group (group_members.next_change)."""
        return self._cluster.force_leave(site)

    def is_up(self, site: str) -> bool:
        return site == self.me or site in self._cluster.membership.running()

    def name_of(self, site: str) -> str:
        if site == self.me:
            return self._cluster.me.node
        member = self._cluster.membership.members.get(site)
        return member.identity.node if member is not None else site

    def status(self) -> dict[str, Any]:
        """`GET /api/v5/raft`: this node's view of its groups."""
        groups = []
        core = self.core()
        if core is not None:
            config = core.log.config
            groups.append({
                "id": GROUP, "name": "metadata", "epoch": f"{self.epoch_of(GROUP):x}",
                "role": ROLE_NAMES[core.role], "leader": core.leader,
                "leader_node": self.name_of(core.leader) if core.leader else None,
                "term": core.term, "commit": core.commit, "applied": core.applied_index,
                "snapshot_index": core.log.snapshot_index,
                "log_entries": len(core.log.entries),
                "voters": sorted(config.voters), "learners": sorted(config.learners),
                "nodes": {site: self.name_of(site) for site in sorted(config.members())},
                # The leader's view of each member's log: how far behind each one is.
                "match": {site: pr.match for site, pr in sorted(core.progress.items())},
            })
        for hosted in self.hosted:
            groups += hosted.status()
        return {"node": self._cluster.me.node, "site": self.me,
                "bootstrap": self.bootstrap.state, "groups": groups}

    def metrics(self) -> list[Sample]:
        transport, proposer = self.transport, self.proposer
        samples: list[Sample] = self._raft.metrics() if self._raft is not None else []
        samples += [
            ("raft_frames_dropped", "counter", "Raft frames dropped on the cluster links",
             {"reason": "no_link"}, float(transport.unlinked)),
            ("raft_frames_dropped", "counter", "Raft frames dropped on the cluster links",
             {"reason": "foreign_epoch"}, float(self.foreign_frames)),
            ("raft_frames_dropped", "counter", "Raft frames dropped on the cluster links",
             {"reason": "garbled"}, float(transport.garbled)),
            ("raft_retained_pending", "gauge",
             "Retained messages waiting to be proposed to the metadata group", {},
             float(len(proposer))),
            ("raft_retained_batches", "counter",
             "Batches of retained messages committed (one log entry each)", {},
             float(proposer.batches)),
            ("raft_retained_committed", "counter", "Retained messages committed", {},
             float(proposer.commands)),
            ("raft_retained_timeouts", "counter",
             "Retained messages not committed within durable_storage.raft.commit_timeout",
             {}, float(proposer.timed_out)),
        ]
        return samples
