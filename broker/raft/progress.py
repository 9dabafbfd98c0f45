"""What a leader knows about one follower's log (etcd's "progress").

PROBE: one AppendEntries at a time until the follower's log is found to match; REPLICATE:
pipelined, up to `MAX_INFLIGHT` unacknowledged messages; SNAPSHOT: the follower needs the
state machine's snapshot, sent in chunks, up to `SNAPSHOT_WINDOW` unacknowledged: one at a time,
the transfer would move one chunk per round trip between two busy event loops, the sender's
reading and the receiver's writing each waiting for the other.
"""

from collections import deque
from typing import Final

PROBE: Final = 0
REPLICATE: Final = 1
SNAPSHOT: Final = 2

MAX_INFLIGHT: Final = 64
SNAPSHOT_WINDOW: Final = 4


class Progress:
    __slots__ = ("active", "commit_sent", "heartbeat_seq", "inflight", "match", "next",
                 "probe_sent", "snapshot_asked", "snapshot_end", "snapshot_index",
                 "snapshot_last_sent", "snapshot_resumed", "snapshot_sent", "snapshot_ticks",
                 "state")

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
        self.snapshot_sent: deque[int] = deque()  # the end of each chunk sent, unacknowledged
        self.snapshot_end = 0  # the end of the last chunk sent: where the next one starts
        self.snapshot_last_sent = False  # the chunk with `done` is sent: none follows it
        # The offset the follower asked to go on from, until a chunk after it is
        # acknowledged: the chunks sent before its answer arrived are refused, each answered
        # with that same offset, which is then no news.
        self.snapshot_resumed = -1

    def become_probe(self) -> None:
        self.state = PROBE
        self.probe_sent = False
        self.inflight.clear()
        self.next = self.match + 1
        self._end_snapshot()

    def start_snapshot(self) -> None:
        """A transfer starts: no chunk of an earlier one counts."""
        self.state = SNAPSHOT
        self.snapshot_ticks = 0
        self._end_snapshot()

    def _end_snapshot(self) -> None:
        self.snapshot_index = 0
        self.snapshot_asked = -1
        self.snapshot_sent.clear()
        self.snapshot_last_sent = False
        self.snapshot_resumed = -1

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
