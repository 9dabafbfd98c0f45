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

from dataclasses import dataclass, field

from broker.raft.messages import Config, Entry, Message


@dataclass(frozen=True, slots=True)
class HardState:
    term: int
    vote: str | None


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    index: int
    term: int
    config: Config


@dataclass(slots=True)
class SnapshotChunk:
    """A piece of a snapshot received from the leader, for the state machine. With the
    last one (`done`), the state machine keeps `index`, `term` and `config` durably with
    its data: after a crash before the log's marker is on disk, they are given back to the
    core (`RaftGroup(snapshot=...)`)."""

    index: int
    term: int
    config: Config
    offset: int
    data: bytes
    done: bool


@dataclass(slots=True)
class SnapshotRequest:
    """The leader needs the chunk at `offset` of the snapshot at `index` for `peer`;
    `index` 0 asks the state machine to choose one (at most its applied index)."""

    peer: str
    index: int
    offset: int


@dataclass(slots=True)
class Ready:
    seq: int
    hard_state: HardState | None = None
    snapshot: SnapshotMeta | None = None
    entries: list[Entry] = field(default_factory=list)
    messages: list[tuple[str, Message]] = field(default_factory=list)
    after_persist: list[tuple[str, Message]] = field(default_factory=list)
    committed: list[Entry] = field(default_factory=list)
    snapshot_chunks: list[SnapshotChunk] = field(default_factory=list)
    snapshot_requests: list[SnapshotRequest] = field(default_factory=list)
    reads: list[tuple[object, int]] = field(default_factory=list)
    reads_failed: list[object] = field(default_factory=list)
    role_changed: bool = False

    def has_writes(self) -> bool:
        return (self.hard_state is not None or self.snapshot is not None
                or bool(self.entries))
