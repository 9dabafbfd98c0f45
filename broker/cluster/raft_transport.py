"""Raft's traffic on the cluster links: channel RAFT of the one connection per peer that
every group shares (a node's groups need no sockets, ports or threads of their own).

    frame := epoch:u64  message        (message: broker/raft/messages.py; group id at 1..4)

The epoch names a group's incarnation, chosen at random when it is bootstrapped
(broker/cluster/bootstrap.py). Raft tells logs apart by (index, term) alone, and every
incarnation of a group starts with a configuration entry at index 1 of term 1: two nodes
that each bootstrapped alone, or a node back from a wipe, would otherwise take each other's
entries for their own. The receiver checks the epoch before Raft sees the message.

A message for a peer with no link now is dropped and counted: Raft resends what matters
(heartbeats, probes, appends not acknowledged).
"""

import struct
from collections.abc import Callable
from typing import Final

from broker.cluster.frames import Channel
from broker.cluster.service import Cluster

_EPOCH: Final = struct.Struct(">Q")
_GROUP: Final = struct.Struct(">I")
_HEAD: Final = _EPOCH.size + 1 + _GROUP.size  # epoch, message type, group id

# (peer site, group, epoch, Raft message)
Deliver = Callable[[str, int, int, bytes], None]


class RaftTransport:
    def __init__(self, cluster: Cluster, epoch_of: Callable[[int], int],
                 deliver: Deliver) -> None:
        self._cluster = cluster
        self._epoch_of = epoch_of
        self._deliver = deliver
        self.unlinked = 0  # messages for a peer without a link, dropped
        self.garbled = 0
        cluster.on(Channel.RAFT, self._frame)

    def send(self, peer: str, data: bytes) -> None:
        (group,) = _GROUP.unpack_from(data, 1)
        if not self._cluster.send(peer, Channel.RAFT, _EPOCH.pack(self._epoch_of(group)) + data):
            self.unlinked += 1

    def flush(self) -> None:
        self._cluster.flush()

    def _frame(self, site: str, payload: bytes) -> None:
        if len(payload) < _HEAD:
            self.garbled += 1
            return
        (epoch,) = _EPOCH.unpack_from(payload)
        (group,) = _GROUP.unpack_from(payload, _EPOCH.size + 1)
        self._deliver(site, group, epoch, payload[_EPOCH.size:])
