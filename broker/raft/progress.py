"""What a leader knows about one follower's log (etcd's "progress").

PROBE: one AppendEntries at a time until the follower's log is found to match; REPLICATE:
pipelined, up to `MAX_INFLIGHT` unacknowledged messages; SNAPSHOT: the follower needs the
state machine's snapshot, sent in chunks one at a time.
"""

from collections import deque
from typing import Final

PROBE: Final = 0
REPLICATE: Final = 1
SNAPSHOT: Final = 2

MAX_INFLIGHT: Final = 64


class Progress:
    __slots__ = ("active", "commit_sent", "heartbeat_seq", "inflight", "match", "next",
                 "probe_sent", "snapshot_asked", "snapshot_index", "snapshot_ticks", "state")

    def __init__(self, next_index: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = PROBE
        self.probe_sent = False
        self.inflight: deque[int] = deque()  # last index of each unacknowledged append
        self.active = True  # heard from within the current check-quorum period
        self.heartbeat_seq = 0  # highest heartbeat sequence acknowledged
        self.commit_sent = 0  # the highest commit index the follower was told
        self.snapshot_index = 0  # the snapshot being sent (0: none chosen yet)
        self.snapshot_ticks = 0  # ticks since the snapshot transfer last moved
        # The offset of the chunk asked of the state machine and not yet given (-1: none):
        # a machine that answered None (preparing, or pacing its transfers) is asked again
        # for it when it says it is ready (`RaftGroup.snapshot_ready`).
        self.snapshot_asked = -1

    def become_probe(self) -> None:
        self.state = PROBE
        self.probe_sent = False
        self.inflight.clear()
        self.next = self.match + 1
        self.snapshot_index = 0
        self.snapshot_asked = -1

    def acknowledge(self, index: int) -> bool:
        """Records that the follower matches up to `index`; True if that is news."""
        inflight = self.inflight
        while inflight and inflight[0] <= index:
            inflight.popleft()
        if index <= self.match:
            return False
        self.match = index
        if self.next <= index:
            self.next = index + 1
        return True

    def can_send(self) -> bool:
        if self.state == REPLICATE:
            return len(self.inflight) < MAX_INFLIGHT
        return self.state == PROBE and not self.probe_sent
