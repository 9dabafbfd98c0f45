"""The asyncio shell of a node's Raft groups: one timer, one write-ahead log, group commit.

All I/O of Raft happens here, and little else: ticks drive every group from one timer;
whatever the groups produce during an event-loop turn is collected by one `flush` at the end
of the turn (RaftHost.flush); the log's own thread writes the turn's log batch and
fdatasyncs it, so the event loop never waits for the disk (and applies committed entries
while it runs), then the loop releases the messages that waited for it (vote grants,
acknowledgements) and lets the groups commit.
Batches that pile up while an fsync runs share the next one.

The write starts from the flush and its end comes back as one callback, with no task or
future between: on a follower the write is on every commit's path (append, fsync, answer),
and each hop through the event loop there is a turn, under load a wait for the CPU.

Peers are reached through a `Transport` (the cluster links); what arrives from one is handed
to `receive`.
"""

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from broker.raft.balance import moves
from broker.raft.core import LEADER, RaftGroup
from broker.raft.host import HostBatch, RaftHost, Sample, StateMachine, Transport, anyone
from broker.raft.ready import SnapshotMeta
from broker.raft.wal import FileStore, RecoveredGroup, WalBatch, WriteAheadLog, WriteRefused

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0  # how often a log that had no space is written again


class CommandLost(Exception):
    """Another entry took the proposal's index (leadership changed before it committed)."""


class LeadershipLost(Exception):
    """A read-index read could not be confirmed: the node stopped leading first."""


class RaftNode:
    def __init__(self, node_id: str, directory: str, transport: Transport, *,
                 tick_seconds: float = 0.05, election_ticks: int = 10,
                 heartbeat_ticks: int = 2, segment_bytes: int = 64 << 20,
                 seed: int | None = None,
                 can_transfer_to: Callable[[str], bool] = anyone) -> None:
        self.id = node_id
        self.tick_seconds = tick_seconds
        self.wal = WriteAheadLog(FileStore(directory), segment_bytes)
        self.recovered: dict[int, RecoveredGroup] = self.wal.recover()
        self.host = RaftHost(node_id, self.wal, transport, random.Random(seed),
                             election_ticks, heartbeat_ticks, can_transfer_to)
        self._loop = asyncio.get_running_loop()
        self._flush_scheduled = False
        self._to_write: list[HostBatch] = []
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []
        # One thread of its own: an fsync never queues behind the default executor's work.
        self._disk = ThreadPoolExecutor(1, thread_name_prefix=f"raft-wal-{node_id}")
        self._committing: Future[None] | None = None
        self._failed = False
        # No space for the log: the batches wait and are written again every RETRY_SECONDS;
        # meanwhile nothing of them is acknowledged (their messages wait for the write).
        self._full = False
        self._retry: asyncio.TimerHandle | None = None
        # A group whose state machine could not apply (RaftHost.retry): retried on a timer,
        # once `room()` says the volume has room again.
        self._apply_retry: asyncio.TimerHandle | None = None
        self.room: Callable[[], bool] = lambda: True
        # Told when the log cannot be written or an entry applied (the error) and when both
        # go on again (None): the node's disk_full alarm.
        self.on_disk: Callable[[BaseException | None], object] = lambda error: None
        self._disk_failing = False
        self._closed = False
        self._tasks = [self._loop.create_task(self._ticker())]

    def add_group(self, group: int, machine: StateMachine,
                  voters: frozenset[str] = frozenset(), applied: int = 0,
                  snapshot: SnapshotMeta | None = None) -> RaftGroup:
        """Hosts a group, from what the log recovered of it if anything (see RaftHost)."""
        core = self.host.add_group(group, machine, self.recovered.pop(group, None), voters,
                                   applied, snapshot)
        self._schedule_flush()
        return core

    def core(self, group: int) -> RaftGroup:
        return self.host.core(group)

    def receive(self, peer: str, data: bytes) -> None:
        if self._closed:
            return
        self.host.receive(peer, data)
        self._schedule_flush()

    async def propose(self, group: int, data: bytes) -> int:
        """Returns the command's index once it is committed and applied here. Raises
        NotLeader at once, CommandLost when a change of leader dropped it."""
        future: asyncio.Future[bool] = self._loop.create_future()
        index = self.host.propose(group, data, lambda ok: _settle(future, ok))
        self._schedule_flush()
        if not await future:
            raise CommandLost(f"group {group}: index {index} went to another command")
        return index

    async def read_index(self, group: int) -> None:
        """Returns once the local state machine may serve a linearizable read (leadership
        confirmed by a majority, everything committed before the call applied)."""
        future: asyncio.Future[bool] = self._loop.create_future()
        self.host.read_index(group, lambda ok: _settle(future, ok))
        self._schedule_flush()
        if not await future:
            raise LeadershipLost(f"group {group}: leadership lost before the read")

    def compact(self, group: int, index: int) -> None:
        self.host.compact(group, index)
        self._schedule_flush()

    def snapshot_ready(self, group: int) -> None:
        """The group's state machine prepared the snapshot it answered None for."""
        self.core(group).snapshot_ready()
        self._schedule_flush()

    def unreachable(self, peer: str) -> None:
        self.host.unreachable(peer)
        self._schedule_flush()

    def peer_lost(self, peer: str) -> None:
        self.host.peer_lost(peer)
        self._schedule_flush()

    def add_learner(self, group: int, node: str) -> None:
        """Membership changes (see RaftGroup): raise NotLeader or ConfigChangeRefused."""
        self.core(group).add_learner(node)
        self._schedule_flush()

    def promote(self, group: int, node: str) -> None:
        self.core(group).promote(node)
        self._schedule_flush()

    def remove(self, group: int, node: str) -> None:
        self.core(group).remove(node)
        self._schedule_flush()

    def led(self) -> list[int]:
        """The groups this node leads now."""
        return [group for group, hosted in self.host.groups.items()
                if hosted.core.role == LEADER]

    async def hand_over(self, timeout: float) -> tuple[list[int], list[int]]:
        """Hands the leadership of every group this node leads to another voter (a graceful
        stop: the groups need not wait an election timeout to notice it is gone) until each
        group has another leader, has no voter to hand it to, or `timeout` seconds passed;
        returns the groups handed over and those it still leads. A transfer given up (its
        election timeout passed) is tried again meanwhile."""
        led = self.led()
        handing = set(led)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while True:
                    handing -= self._transfer(sorted(handing), logging.DEBUG, "")
                    waiting = [group for group in handing if not self._led_elsewhere(group)]
                    if not waiting:
                        break
                    # Until each has another leader, or this node leads it with no transfer
                    # under way (given up, or elected again): then try again.
                    await self.wait(functools.partial(self._transfers_settled, waiting))
        return [group for group in led if self._led_elsewhere(group)], self.led()

    def balance_leaders(self) -> list[tuple[int, str]]:
        """One round of spreading the groups' leaderships over the voters (see
        broker/raft/balance.py): hands over the groups this node leads beyond its share;
        returns those moves. Nothing while a transfer is under way or the disk is full."""
        if self._full or self.host.stalled or any(
                hosted.core.transferee is not None for hosted in self.host.groups.values()):
            return []
        groups = {group: (hosted.core.leader, hosted.core.log.config.voters)
                  for group, hosted in self.host.groups.items()}
        planned = moves(self.id, groups, self.host.can_transfer_to)
        for group, target in planned:
            log.info("group %d: handing leadership to %s (leaders spread)", group, target)
            self.core(group).transfer_leadership(target)
        if planned:
            self._schedule_flush()
        return planned

    def _shed_leadership(self) -> None:
        """This node cannot write (its log or a state machine's storage has no space): the
        groups it leads go to voters that can, as at a graceful stop, instead of waiting on
        this disk (a full leader commits through its followers but cannot apply, so nothing
        it leads is acknowledged). It is not elected again meanwhile: a vote, its own too,
        waits for the disk. Called on every retry while the disk stays full, since a
        transfer gives up after an election timeout."""
        self._transfer(self.led(), logging.WARNING, " (no space here)")

    def _transfer(self, groups: Iterable[int], level: int, why: str) -> set[int]:
        """Starts handing each group this node leads, with no transfer under way, to another
        voter; returns those with no voter to take it."""
        stuck = set()
        for group in groups:
            core = self.core(group)
            if core.role == LEADER and core.transferee is None:
                target = self.host.transfer_leadership(group)
                if target is None:
                    stuck.add(group)
                else:
                    log.log(level, "group %d: handing leadership to %s%s", group, target, why)
        self._schedule_flush()
        return stuck

    def _led_elsewhere(self, group: int) -> bool:
        return self.core(group).leader not in (None, self.id)

    def _transfers_settled(self, groups: list[int]) -> bool:
        return all(self._led_elsewhere(group) or (
            self.core(group).role == LEADER and self.core(group).transferee is None)
            for group in groups)

    async def wait(self, condition: Callable[[], bool]) -> None:
        """Returns once `condition()` holds, checked after every flush (for tests and
        admin tools: "a leader is elected", "index N is applied")."""
        if condition():
            return
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append((condition, future))
        await future

    def metrics(self) -> list[Sample]:
        return self.host.metrics()

    async def close(self) -> None:
        """Stops at once, as a crash would: what was not fsync'd is not acknowledged. (A
        write already in its thread finishes first: a thread cannot be stopped.)"""
        self._closed = True
        for timer in (self._retry, self._apply_retry):
            if timer is not None:
                timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._committing is not None:
            await asyncio.wait([asyncio.wrap_future(self._committing)])
        self._disk.shutdown()
        self.wal.close()
        for _, future in self._waiters:
            future.cancel()

    # ------------------------------------------------------------------ driving

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed:
            return
        self.host.flush(self._queue)
        if self.host.installs:
            self._start_installs()
        if self.host.apply_errors:
            self._stalled()
        if self.host.has_ready():
            self._schedule_flush()
        if self._waiters:
            waiting = self._waiters
            self._waiters = []
            for condition, future in waiting:
                if future.done():
                    continue
                if condition():
                    future.set_result(None)
                else:
                    self._waiters.append((condition, future))

    def _start_installs(self) -> None:
        """Installs the host handed off the loop: each tells the loop when its work is over
        (from its thread), and the host finishes it there (`_installed`)."""
        installs, self.host.installs = self.host.installs, []
        for group, pending in installs:
            pending.start(functools.partial(self._loop.call_soon_threadsafe,
                                            self._installed, group))

    def _installed(self, group: int) -> None:
        if self._closed:
            return
        self.host.installed(group)
        if self.host.installs:
            self._start_installs()
        if self.host.apply_errors:
            self._stalled()
        self._schedule_flush()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.tick_seconds)
            self.host.tick()
            self._schedule_flush()

    def _stalled(self) -> None:
        """Applying (or rewinding for a retry) raised: reported, retried later."""
        errors, self.host.apply_errors = self.host.apply_errors, []
        for group, error in errors:
            log.error("Raft group %d: its state machine's storage failed (%s); a committed"
                      " entry is applied again, a snapshot received again, once it reopens",
                      group, error)
        self._report_disk(errors[-1][1])
        self._shed_leadership()
        if self._apply_retry is None:
            self._apply_retry = self._loop.call_later(RETRY_SECONDS, self._retry_apply)

    def _retry_apply(self) -> None:
        self._apply_retry = None
        if self._closed:
            return
        if self.room():
            self.host.retry()
        if self.host.apply_errors:
            self._stalled()
        elif self.host.stalled:
            self._shed_leadership()
            self._apply_retry = self._loop.call_later(RETRY_SECONDS, self._retry_apply)
        else:
            log.warning("Raft: every committed entry applied again")
            self._report_disk(None)
        self._schedule_flush()

    def _report_disk(self, error: BaseException | None) -> None:
        """Tells `on_disk` of every failure (a state machine's first failure may not be the
        full disk that the log's next one names: the listener must see both), and once
        when the log and every machine go on again."""
        if error is None and (self._full or self.host.stalled or not self._disk_failing):
            return
        self._disk_failing = error is not None
        self.on_disk(error)

    def _queue(self, batch: HostBatch) -> None:
        """The flush's log batch: written now, or after the running write (group commit)."""
        self._to_write.append(batch)
        if self._committing is None and not self._full:
            self._write()

    def _write(self) -> None:
        """Hands what waits to the log's thread: its batches share one fdatasync."""
        self._retry = None
        if self._failed or self._closed or self._committing is not None:
            return  # after a failed fsync nothing written since may be trusted: see _written
        batches, self._to_write = self._to_write, []
        wal_batches = [batch.wal for batch in batches if batch.wal is not None]
        self._committing = self._disk.submit(self._commit, wal_batches, batches)

    def _commit(self, wal_batches: list[WalBatch], batches: list[HostBatch]) -> None:
        """In the log's thread."""
        error: BaseException | None = None
        try:
            for batch in wal_batches:
                self.wal.write(batch)
            self.wal.sync(wal_batches)
        except BaseException as exc:  # reported on the loop; this thread has no one to tell
            error = exc
        # (RuntimeError: the loop is closed, nobody waits for this write any more.)
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._written, batches, error)

    def _written(self, batches: list[HostBatch], error: BaseException | None) -> None:
        self._committing = None
        if self._closed:
            return
        if isinstance(error, WriteRefused):
            # Nothing of the batch that failed stayed in the file: the same batches are
            # written again, first, once a retry finds room.
            self._to_write[:0] = batches
            if not self._full:
                self._full = True
                log.error("Raft write-ahead log: no space (%s); this node acknowledges and"
                          " votes for nothing until it can write again", error)
                self._report_disk(error)
            self._shed_leadership()
            self._retry = self._loop.call_later(RETRY_SECONDS, self._write)
            return
        if error is not None:
            # A failed fsync may have dropped the written pages (the kernel forgets the
            # error once reported): retrying could report success for lost data. The node
            # stops persisting, so it acknowledges nothing more, until restarted.
            self._failed = True
            log.critical("Raft write-ahead log: write or fsync failed; this node stops "
                         "acknowledging until it is restarted", exc_info=error)
            return
        if self._full:
            self._full = False
            log.warning("Raft write-ahead log: written again")
            self._report_disk(None)
        for batch in batches:
            self.host.synced(batch)
        if self._to_write:
            self._write()
        self._schedule_flush()


def _settle(future: "asyncio.Future[bool]", ok: bool) -> None:
    if not future.done():
        future.set_result(ok)
