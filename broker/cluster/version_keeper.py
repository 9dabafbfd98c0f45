"""Keeps the cluster's effective version (broker/cluster/versions.py) in the metadata group.

The leader of the metadata group raises it, with a `version` entry (broker/retainer/
machine.py), once every member of the cluster and of its Raft groups (voters and learners)
is linked to it running code that supports a higher one; every node applies the entry and
stores the version with the retained messages, so a restart reads it back and a snapshot
carries it. Each node then drops its links to peers whose code cannot run it (they are
refused at their next handshake). One raise at a time; a failed one is tried again at a
later round.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from broker.cluster import versions
from broker.cluster.metadata import GROUP, MetadataGroup
from broker.cluster.proposer import CommitTimeout
from broker.cluster.service import Cluster
from broker.raft.core import LEADER
from broker.retainer.machine import encode_version

log = logging.getLogger(__name__)

_ATTEMPT: Final = 10.0  # seconds a raise may take before a later round tries again


class VersionKeeper:
    def __init__(self, metadata: MetadataGroup, cluster: Cluster) -> None:
        self._metadata = metadata
        self._cluster = cluster
        self._raising: asyncio.Task[None] | None = None
        self._seen = self.effective()
        # What a rise applied here changes on this node (durable groups: Node).
        self.on_rise: Callable[[int], None] = lambda version: None
        cluster.cluster_version = self.effective

    def effective(self) -> int:
        """The cluster's effective version, as applied here."""
        return self._metadata.machine.cluster_version

    def allows(self, cluster_version: int) -> bool:
        """Whether what `cluster_version` introduced may be proposed now."""
        return self.effective() >= cluster_version

    def round(self) -> None:
        """A few times a second: act on a rise applied here; raise it when leading."""
        effective = self.effective()
        if effective > self._seen:
            log.info("the cluster's effective version rose to %d", effective)
            self._seen = effective
            self._cluster.refuse_older(effective)
            self.on_rise(effective)
        core = self._metadata.core()
        if core is None or core.role != LEADER or self._raising is not None:
            return
        # The cluster's members and every group's (a removed site may still be in one).
        sites = self._metadata.member_sites() | self._cluster.group_sites()
        target = versions.next_version(effective,
                                       [self._cluster.speaks(site) for site in sorted(sites)])
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

    async def stop(self) -> None:
        if self._raising is not None:
            self._raising.cancel()
            await asyncio.gather(self._raising, return_exceptions=True)
