"""What a group's core asks of its shell, collected between two `ready()` calls (etcd's Ready).

The shell handles one Ready in this order:
1. hands `snapshot_chunks` to the state machine (a chunk with `done` means: the received
   snapshot replaces your state, durably, before step 2);
2. writes `hard_state`, then `snapshot` (a marker: the log up to its index is compacted or
   replaced), then `entries` (the first one replaces any written entry at its index and
   after) to the write-ahead log, and sends `messages` at once;
3. once every Ready up to this one is on disk (fdatasync), sends `after_persist` and calls
   `persisted(seq)`: they acknowledge what was written (vote grants, appended entries);
4. applies `committed` in order and calls `applied(index)`; serves `reads` once applied
   reaches their index; fails `reads_failed`; answers `snapshot_requests` with
   `send_snapshot_chunk`.
"""

from typing import NamedTuple

from broker.mqtt.record import Record
from broker.raft.messages import Config, Entry, Message


class HardState(NamedTuple):
    term: int
    vote: str | None


class SnapshotMeta(Record):
    """Not a NamedTuple: `index` would hide tuple.index."""

    __match_args__ = ("index", "term", "config")
    __slots__ = __match_args__

    def __init__(self, index: int, term: int, config: Config) -> None:
        self.index = index
        self.term = term
        self.config = config


class SnapshotChunk(Record):
    """A piece of a snapshot received from the leader, for the state machine. With the
    last one (`done`), the state machine keeps `index`, `term` and `config` durably with
    its data: after a crash before the log's marker is on disk, they are given back to the
    core (`RaftGroup(snapshot=...)`)."""

    __match_args__ = ("index", "term", "config", "offset", "data", "done")
    __slots__ = __match_args__

    def __init__(self, index: int, term: int, config: Config, offset: int, data: bytes,
                 done: bool) -> None:
        self.index = index
        self.term = term
        self.config = config
        self.offset = offset
        self.data = data
        self.done = done


class SnapshotRequest(Record):
    """The leader needs the chunk at `offset` of the snapshot at `index` for `peer`;
    `index` 0 asks the state machine to choose one (at most its applied index)."""

    __match_args__ = ("peer", "index", "offset")
    __slots__ = __match_args__

    def __init__(self, peer: str, index: int, offset: int) -> None:
        self.peer = peer
        self.index = index
        self.offset = offset


class Ready(Record):
    __match_args__ = ("seq", "hard_state", "snapshot", "entries", "messages", "after_persist",
                      "committed", "snapshot_chunks", "snapshot_requests", "reads",
                      "reads_failed", "role_changed")
    __slots__ = __match_args__

    def __init__(self, seq: int, hard_state: HardState | None = None,
                 snapshot: SnapshotMeta | None = None, entries: list[Entry] | None = None,
                 messages: list[tuple[str, Message]] | None = None,
                 after_persist: list[tuple[str, Message]] | None = None,
                 committed: list[Entry] | None = None,
                 snapshot_chunks: list[SnapshotChunk] | None = None,
                 snapshot_requests: list[SnapshotRequest] | None = None,
                 reads: list[tuple[object, int]] | None = None,
                 reads_failed: list[object] | None = None, role_changed: bool = False) -> None:
        self.seq = seq
        self.hard_state = hard_state
        self.snapshot = snapshot
        self.entries = [] if entries is None else entries
        self.messages = [] if messages is None else messages
        self.after_persist = [] if after_persist is None else after_persist
        self.committed = [] if committed is None else committed
        self.snapshot_chunks = [] if snapshot_chunks is None else snapshot_chunks
        self.snapshot_requests = [] if snapshot_requests is None else snapshot_requests
        self.reads = [] if reads is None else reads
        self.reads_failed = [] if reads_failed is None else reads_failed
        self.role_changed = role_changed

    def has_writes(self) -> bool:
        return (self.hard_state is not None or self.snapshot is not None
                or bool(self.entries))
