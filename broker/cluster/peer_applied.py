"""Waiting for the other nodes to apply a group's entry, not only for its commit.

A commit means a majority holds an entry; each node acts on it when it applies it, a
heartbeat or so later. For a durable subscription that gap is a loss: a node stores a
message for a durable filter only once it has applied the subscription's record
(`Node.durable_state_applied`), so a PUBLISH it takes right after the SUBACK would be
acknowledged (0x10, no subscribers) and never stored. The SUBACK therefore waits, after the
commit, for every node it has a link to to have applied that far, at most an election
timeout: a node that cannot apply (cut off from the group's leader, or frozen) cannot
commit a durable PUBLISH either, except through a shard whose leader it still reaches,
which is the window left (docs/cluster.md).

Asked over the RPC channel; a node of 0.1.0 knows no such method and answers at once with
an error, which counts as not waiting for it.
"""

import logging
from typing import Any, Final

from broker.cluster.metadata import MetadataGroup
from broker.cluster.rpc import Rpc, RpcError

log = logging.getLogger(__name__)

METHOD: Final = "raft_applied"
_MARGIN: Final = 0.5  # the answer's way back, beyond the peer's own wait


class PeersApplied:
    def __init__(self, rpc: Rpc, metadata: MetadataGroup, bound: float) -> None:
        self._rpc = rpc
        self._metadata = metadata
        self.bound = bound
        rpc.register(METHOD, self._serve)

    async def everywhere(self, group: int, index: int) -> None:
        """Returns once every node with a link has applied `index` of `group`, or after
        the bound; never raises (a peer that did not confirm is logged)."""
        params = {"epoch": self._metadata.epoch_of(group), "group": group, "index": index,
                  "wait": self.bound}
        answers = await self._rpc.multicall(METHOD, params, self.bound + _MARGIN)
        behind = [site for site, answer in answers.items()
                  if not isinstance(answer, int) or answer < index]
        if behind:
            log.info("group %d: index %d not applied on %s within %g s", group, index,
                     ", ".join(behind), self.bound)

    async def _serve(self, params: Any) -> int:
        group, index = int(params["group"]), int(params["index"])
        if int(params["epoch"]) != self._metadata.epoch_of(group):
            raise RpcError("another incarnation of the cluster's groups")
        if self._metadata.core(group) is None:  # joining: it stores nothing yet either
            raise RpcError(f"not a member of group {group}")
        wait = min(float(params["wait"]), self.bound)
        return await self._metadata.until_applied(group, index, wait)
