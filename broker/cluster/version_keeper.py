"""Keeps the cluster's effective version (broker/cluster/versions.py) in the metadata group.

The leader of the metadata group raises it, with a `version` entry (broker/retainer/
machine.py), once every member of the cluster and of its Raft groups (voters and learners)
is linked to it running code that supports a higher one; every node applies the entry and
stores the version with the retained messages, so a restart reads it back and a snapshot
carries it. Each node then drops its links to peers whose code cannot run it (they are
refused at their next handshake), and records it in its data dir's format stamp, where
older code refuses it at start-up before it replays a log it cannot apply
(broker/format_check.py). One raise at a time; a failed one is tried again at a later
round.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from broker.cluster import versions
from broker.cluster.metadata import GROUP, MetadataGroup
from broker.cluster.proposer import CommitTimeout
from broker.cluster.service import Cluster
from broker.raft.core import LEADER
from broker.retainer.machine import encode_version

log = logging.getLogger(__name__)

_ATTEMPT: Final = 10.0  # seconds a raise may take before a later round tries again
# Seconds a request waits for a rise every member's code is ready for (`until`): the
# metadata leader's next round, its commit and this node's next round.
RISE_WAIT: Final = 5.0


class VersionKeeper:
    def __init__(self, metadata: MetadataGroup, cluster: Cluster,
                 record: Callable[[int], None]) -> None:
        """`record`: writes the version the cluster runs where start-up checks it (blocking,
        once per rise: format_check.record_cluster_version). At start it runs here; a rise
        is recorded on a worker thread (`_record_soon`)."""
        self._metadata = metadata
        self._cluster = cluster
        self._record = record
        self._raising: asyncio.Task[None] | None = None
        self._recording: asyncio.Task[None] | None = None  # the last rise's record
        self._seen = self.effective()
        record(self._seen)  # a rise a crash kept from being recorded, or one before 0.2.0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        # What a rise applied here changes on this node (durable groups: Node).
        self.on_rise: Callable[[int], None] = lambda version: None
        cluster.cluster_version = self.effective

    def effective(self) -> int:
        """The cluster's effective version, as applied here."""
        return self._metadata.machine.cluster_version

    def allows(self, cluster_version: int) -> bool:
        """Whether what `cluster_version` introduced may be proposed now."""
        return self.effective() >= cluster_version

    def until(self, cluster_version: int) -> Awaitable[bool] | None:
        """A wait (True once the cluster allows `cluster_version`, False after RISE_WAIT)
        when it does not yet but is about to: every member's code runs it, so the metadata
        leader raises it at its next round (a fresh cluster's first moments). None when it
        allows it already, or will not soon (a member runs older code, or is not linked)."""
        effective = self.effective()
        if effective >= cluster_version:
            return None
        target = self._next_version(effective)
        if target is None or target < cluster_version:
            return None
        risen = asyncio.get_running_loop().create_future()
        self._waiters.append((cluster_version, risen))
        return self._wait(risen)

    @staticmethod
    async def _wait(risen: "asyncio.Future[None]") -> bool:
        try:
            async with asyncio.timeout(RISE_WAIT):
                await risen  # cancelled with the wait: `round` then forgets it
        except TimeoutError:
            return False
        return True

    def _next_version(self, effective: int) -> int | None:
        # The cluster's members and every group's (a removed site may still be in one).
        sites = self._metadata.member_sites() | self._cluster.group_sites()
        return versions.next_version(effective,
                                     [self._cluster.speaks(site) for site in sorted(sites)])

    def round(self) -> None:
        """A few times a second: act on a rise applied here; raise it when leading."""
        effective = self.effective()
        if effective > self._seen:
            log.info("the cluster's effective version rose to %d", effective)
            self._seen = effective
            self._record_soon(effective)
            self._cluster.refuse_older(effective)
            self.on_rise(effective)
        if self._waiters:
            waiting = self._waiters
            self._waiters = [(version, risen) for version, risen in waiting
                             if version > effective and not risen.done()]
            for version, risen in waiting:
                if version <= effective and not risen.done():
                    risen.set_result(None)
        core = self._metadata.core()
        if core is None or core.role != LEADER or self._raising is not None:
            return
        target = self._next_version(effective)
        if target is not None:
            self._raising = asyncio.get_running_loop().create_task(self._raise(target))

    async def _raise(self, target: int) -> None:
        log.info("every member runs cluster version %d: raising the cluster's version to it",
                 target)
        try:
            async with asyncio.timeout(_ATTEMPT):
                await self._metadata.commit(GROUP, encode_version(target))
        except (TimeoutError, CommitTimeout):
            log.info("raising the cluster's version to %d: not committed yet", target)
        finally:
            self._raising = None

    def _record_soon(self, version: int) -> None:
        """The record of a rise, on a worker thread after the one before it (each reads the
        stamp and writes only a higher version: two at once could lower it). Its two fsyncs
        took 10-150 ms on the event loop of a new replica, which sees the rise while its
        snapshots arrive. A crash before it is written leaves the older version, as one
        between applying the rise and recording it always could (format_check)."""
        self._recording = asyncio.get_running_loop().create_task(
            self._record_after(self._recording, version))

    async def _record_after(self, previous: "asyncio.Task[None] | None", version: int) -> None:
        if previous is not None:
            await previous
        try:
            await asyncio.to_thread(self._record, version)
        except OSError:
            log.exception("the cluster's version %d not recorded in the data dir", version)

    async def stop(self) -> None:
        if self._raising is not None:
            self._raising.cancel()
            await asyncio.gather(self._raising, return_exceptions=True)
        if self._recording is not None:
            await asyncio.gather(self._recording, return_exceptions=True)
