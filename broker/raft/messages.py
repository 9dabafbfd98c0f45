"""Raft's messages, log entries and cluster configurations, and their binary codec.

Every message travels as one frame on the node's link to a peer (the transport says who sent
it, so no message carries its sender):

    offset  size  field
    0       1     message type (the `_TYPE_*` constants below)
    1       4     group id, unsigned big-endian
    5       8     term, unsigned big-endian
    13      ...   the type's fields, fixed-size integers big-endian, in declaration order

Entries (in AppendEntries, and in the write-ahead log's entry records) are a count (4 bytes)
then, per entry, term (8), kind (1), data length (4), data; their indexes follow from the
first one's. A configuration is a count (2) then, per member, a role byte (0 voter,
1 learner), a name length (1) and the name in UTF-8.

InstallSnapshot ends with its configuration, then the data's length (4) and the data.

RequestVote's last byte is a set of flags: 1 pre-vote, 2 leadership transfer. A 0.1.0 node
reads the byte as a boolean, so it takes a transfer's vote request for a pre-vote and answers
one, which the candidate ignores: only nodes that know transfers vote in one (too few of them,
and the group elects as after a leader's crash). TimeoutNow
(type 10) is new since 0.1.0, whose decoder drops it as an unknown type; a leader sends it
only to a peer its host says may receive it (RaftHost's `can_transfer_to`).

A frame that is too short, too long, of an unknown type or with a bad configuration raises
`MalformedMessage`; the shell drops and counts it.
"""

import struct
from typing import Final, NamedTuple

from broker.mqtt.record import Record

NORMAL: Final = 0  # a command of the group's state machine
CONFIG: Final = 1  # a new configuration (`Config.encode`); takes effect when appended
NOOP: Final = 2  # appended by a new leader to commit its predecessors' entries


class MalformedMessage(ValueError):
    pass


class Entry(Record):
    __match_args__ = ("index", "term", "kind", "data")
    __slots__ = __match_args__

    def __init__(self, index: int, term: int, kind: int, data: bytes) -> None:
        self.index = index
        self.term = term
        self.kind = kind
        self.data = data


class Config(NamedTuple):
    """Who votes and who only replicates. Configurations change one server at a time
    (Raft thesis section 4.1), so any two successive ones have overlapping majorities."""

    voters: frozenset[str]
    learners: frozenset[str] = frozenset()

    def members(self) -> frozenset[str]:
        return self.voters | self.learners

    def encode(self) -> bytes:
        parts = [_U16.pack(len(self.voters) + len(self.learners))]
        for role, names in ((0, self.voters), (1, self.learners)):
            for name in sorted(names):
                raw = name.encode()
                parts.append(bytes((role, len(raw))))
                parts.append(raw)
        return b"".join(parts)

    @staticmethod
    def decode(data: bytes) -> "Config":
        config, end = _decode_config(data, 0)
        if end != len(data):
            raise MalformedMessage("trailing bytes after a configuration")
        return config


EMPTY_CONFIG: Final = Config(frozenset())


class AppendEntries(Record):
    __match_args__ = ("group", "term", "prev_index", "prev_term", "commit", "entries")
    __slots__ = __match_args__

    def __init__(self, group: int, term: int, prev_index: int, prev_term: int, commit: int,
                 entries: list[Entry]) -> None:
        self.group = group
        self.term = term
        self.prev_index = prev_index
        self.prev_term = prev_term
        self.commit = commit
        self.entries = entries


class AppendResponse(Record):
    """`index`: on success the last index the follower now matches (and has on disk); on a
    refusal the `prev_index` it refused, with `hint` the last index that may match."""

    __match_args__ = ("group", "term", "success", "index", "hint")
    __slots__ = __match_args__

    def __init__(self, group: int, term: int, success: bool, index: int, hint: int) -> None:
        self.group = group
        self.term = term
        self.success = success
        self.index = index
        self.hint = hint


class Heartbeat(Record):
    """Carries `commit` (at most what the follower is known to match) and a sequence number
    that the read-index path counts acknowledgements of; no log consistency check."""

    __match_args__ = ("group", "term", "commit", "seq")
    __slots__ = __match_args__

    def __init__(self, group: int, term: int, commit: int, seq: int) -> None:
        self.group = group
        self.term = term
        self.commit = commit
        self.seq = seq


class Commit(Record):
    """A new commit index (at most what the follower is known to match), sent as soon as
    the leader has it so a follower applies without waiting for the next append or
    heartbeat. Unanswered: an answer would tell the leader nothing it does not know, and
    one commit notice per follower per entry would otherwise cost the leader an extra
    message to read per entry; a lost one is made good by the next heartbeat."""

    __match_args__ = ("group", "term", "commit")
    __slots__ = __match_args__

    def __init__(self, group: int, term: int, commit: int) -> None:
        self.group = group
        self.term = term
        self.commit = commit


class HeartbeatResponse(Record):
    __match_args__ = ("group", "term", "seq")
    __slots__ = __match_args__

    def __init__(self, group: int, term: int, seq: int) -> None:
        self.group = group
        self.term = term
        self.seq = seq


class RequestVote(Record):
    """A pre-vote (`pre_vote`) asks "would you vote for me in `term`?" without anyone's term
    changing, so a server that cannot win never disrupts the group. `transfer`: the leader
    asked the candidate to take over (TimeoutNow), so a voter grants it although it hears
    from a live leader (etcd's campaignTransfer)."""

    __match_args__ = ("group", "term", "last_index", "last_term", "pre_vote", "transfer")
    __slots__ = __match_args__

    def __init__(self, group: int, term: int, last_index: int, last_term: int,
                 pre_vote: bool, transfer: bool = False) -> None:
        self.group = group
        self.term = term
        self.last_index = last_index
        self.last_term = last_term
        self.pre_vote = pre_vote
        self.transfer = transfer


class VoteResponse(Record):
    __match_args__ = ("group", "term", "granted", "pre_vote")
    __slots__ = __match_args__

    def __init__(self, group: int, term: int, granted: bool, pre_vote: bool) -> None:
        self.group = group
        self.term = term
        self.granted = granted
        self.pre_vote = pre_vote


class InstallSnapshot(Record):
    """One chunk of the state machine's snapshot at `index`; `data` is opaque."""

    __match_args__ = ("group", "term", "index", "snapshot_term", "config", "offset", "data", "done")
    __slots__ = __match_args__

    def __init__(self, group: int, term: int, index: int, snapshot_term: int, config: Config,
                 offset: int, data: bytes, done: bool) -> None:
        self.group = group
        self.term = term
        self.index = index
        self.snapshot_term = snapshot_term
        self.config = config
        self.offset = offset
        self.data = data
        self.done = done


class SnapshotResponse(Record):
    """`offset`: the next byte the follower expects; `done`: the snapshot is installed."""

    __match_args__ = ("group", "term", "index", "offset", "done")
    __slots__ = __match_args__

    def __init__(self, group: int, term: int, index: int, offset: int, done: bool) -> None:
        self.group = group
        self.term = term
        self.index = index
        self.offset = offset
        self.done = done


class TimeoutNow(Record):
    """The leader hands its leadership over: the receiver, whose log the leader knows to
    match its own, campaigns at once (Raft thesis section 3.10)."""

    __match_args__ = ("group", "term")
    __slots__ = __match_args__

    def __init__(self, group: int, term: int) -> None:
        self.group = group
        self.term = term


Message = (AppendEntries | AppendResponse | Heartbeat | HeartbeatResponse | RequestVote
           | VoteResponse | InstallSnapshot | SnapshotResponse | Commit | TimeoutNow)

_TYPE_APPEND: Final = 1
_TYPE_APPEND_RESPONSE: Final = 2
_TYPE_HEARTBEAT: Final = 3
_TYPE_HEARTBEAT_RESPONSE: Final = 4
_TYPE_VOTE: Final = 5
_TYPE_VOTE_RESPONSE: Final = 6
_TYPE_SNAPSHOT: Final = 7
_TYPE_SNAPSHOT_RESPONSE: Final = 8
_TYPE_COMMIT: Final = 9
_TYPE_TIMEOUT_NOW: Final = 10

_PRE_VOTE: Final = 1
_TRANSFER: Final = 2

_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_HEAD: Final = struct.Struct(">BIQ")
_APPEND: Final = struct.Struct(">BIQQQQI")
_ENTRY: Final = struct.Struct(">QBI")
_APPEND_RESPONSE: Final = struct.Struct(">BIQBQQ")
_HEARTBEAT: Final = struct.Struct(">BIQQQ")
_HEARTBEAT_RESPONSE: Final = struct.Struct(">BIQQ")
_VOTE: Final = struct.Struct(">BIQQQB")
_VOTE_RESPONSE: Final = struct.Struct(">BIQBB")
_SNAPSHOT: Final = struct.Struct(">BIQQQQB")
_SNAPSHOT_RESPONSE: Final = struct.Struct(">BIQQQB")
_COMMIT: Final = struct.Struct(">BIQQ")


def encode_entries(entries: list[Entry]) -> bytes:
    parts = [_U32.pack(len(entries))]
    pack = _ENTRY.pack
    for entry in entries:
        parts.append(pack(entry.term, entry.kind, len(entry.data)))
        parts.append(entry.data)
    return b"".join(parts)


def decode_entries(data: bytes | memoryview, offset: int, first_index: int
                   ) -> tuple[list[Entry], int]:
    """The entries at `offset` and the offset after them."""
    try:
        (count,) = _U32.unpack_from(data, offset)
        offset += 4
        entries = []
        unpack = _ENTRY.unpack_from
        size = _ENTRY.size
        for i in range(count):
            term, kind, length = unpack(data, offset)
            offset += size
            end = offset + length
            if end > len(data):
                raise MalformedMessage("entry runs past the end")
            entries.append(Entry(first_index + i, term, kind, bytes(data[offset:end])))
            offset = end
    except struct.error as exc:
        raise MalformedMessage(str(exc)) from None
    return entries, offset


def encode(message: Message) -> bytes:
    if isinstance(message, AppendEntries):
        head = _APPEND.pack(_TYPE_APPEND, message.group, message.term, message.prev_index,
                            message.prev_term, message.commit, len(message.entries))
        if not message.entries:
            return head
        parts = [head]
        pack = _ENTRY.pack
        for entry in message.entries:
            parts.append(pack(entry.term, entry.kind, len(entry.data)))
            parts.append(entry.data)
        return b"".join(parts)
    if isinstance(message, AppendResponse):
        return _APPEND_RESPONSE.pack(_TYPE_APPEND_RESPONSE, message.group, message.term,
                                     message.success, message.index, message.hint)
    if isinstance(message, Heartbeat):
        return _HEARTBEAT.pack(_TYPE_HEARTBEAT, message.group, message.term, message.commit,
                               message.seq)
    if isinstance(message, HeartbeatResponse):
        return _HEARTBEAT_RESPONSE.pack(_TYPE_HEARTBEAT_RESPONSE, message.group, message.term,
                                        message.seq)
    if isinstance(message, RequestVote):
        return _VOTE.pack(_TYPE_VOTE, message.group, message.term, message.last_index,
                          message.last_term, (_PRE_VOTE if message.pre_vote else 0)
                          | (_TRANSFER if message.transfer else 0))
    if isinstance(message, VoteResponse):
        return _VOTE_RESPONSE.pack(_TYPE_VOTE_RESPONSE, message.group, message.term,
                                   message.granted, message.pre_vote)
    if isinstance(message, InstallSnapshot):
        return b"".join((
            _SNAPSHOT.pack(_TYPE_SNAPSHOT, message.group, message.term, message.index,
                           message.snapshot_term, message.offset, message.done),
            message.config.encode(), _U32.pack(len(message.data)), message.data))
    if isinstance(message, Commit):
        return _COMMIT.pack(_TYPE_COMMIT, message.group, message.term, message.commit)
    if isinstance(message, TimeoutNow):
        return _HEAD.pack(_TYPE_TIMEOUT_NOW, message.group, message.term)
    return _SNAPSHOT_RESPONSE.pack(_TYPE_SNAPSHOT_RESPONSE, message.group, message.term,
                                   message.index, message.offset, message.done)


def decode(data: bytes) -> Message:
    try:
        kind, group, term = _HEAD.unpack_from(data, 0)
        if kind == _TYPE_APPEND:
            _, _, _, prev_index, prev_term, commit, _ = _APPEND.unpack_from(data, 0)
            entries, end = decode_entries(data, _APPEND.size - 4, prev_index + 1)
            _expect_end(data, end)
            return AppendEntries(group, term, prev_index, prev_term, commit, entries)
        if kind == _TYPE_APPEND_RESPONSE:
            _expect_end(data, _APPEND_RESPONSE.size)
            _, _, _, success, index, hint = _APPEND_RESPONSE.unpack(data)
            return AppendResponse(group, term, bool(success), index, hint)
        if kind == _TYPE_HEARTBEAT:
            _expect_end(data, _HEARTBEAT.size)
            _, _, _, commit, seq = _HEARTBEAT.unpack(data)
            return Heartbeat(group, term, commit, seq)
        if kind == _TYPE_HEARTBEAT_RESPONSE:
            _expect_end(data, _HEARTBEAT_RESPONSE.size)
            return HeartbeatResponse(group, term, _HEARTBEAT_RESPONSE.unpack(data)[3])
        if kind == _TYPE_VOTE:
            _expect_end(data, _VOTE.size)
            _, _, _, last_index, last_term, flags = _VOTE.unpack(data)
            if flags > _PRE_VOTE | _TRANSFER:
                raise MalformedMessage(f"unknown vote request flags {flags}")
            return RequestVote(group, term, last_index, last_term, bool(flags & _PRE_VOTE),
                               bool(flags & _TRANSFER))
        if kind == _TYPE_VOTE_RESPONSE:
            _expect_end(data, _VOTE_RESPONSE.size)
            _, _, _, granted, pre = _VOTE_RESPONSE.unpack(data)
            return VoteResponse(group, term, bool(granted), bool(pre))
        if kind == _TYPE_SNAPSHOT:
            _, _, _, index, snapshot_term, offset, done = _SNAPSHOT.unpack_from(data, 0)
            config, end = _decode_config(data, _SNAPSHOT.size)
            (length,) = _U32.unpack_from(data, end)
            _expect_end(data, end + 4 + length)
            return InstallSnapshot(group, term, index, snapshot_term, config, offset,
                                   bytes(data[end + 4:]), bool(done))
        if kind == _TYPE_SNAPSHOT_RESPONSE:
            _expect_end(data, _SNAPSHOT_RESPONSE.size)
            _, _, _, index, offset, done = _SNAPSHOT_RESPONSE.unpack(data)
            return SnapshotResponse(group, term, index, offset, bool(done))
        if kind == _TYPE_COMMIT:
            _expect_end(data, _COMMIT.size)
            return Commit(group, term, _COMMIT.unpack(data)[3])
        if kind == _TYPE_TIMEOUT_NOW:
            _expect_end(data, _HEAD.size)
            return TimeoutNow(group, term)
    except struct.error as exc:
        raise MalformedMessage(str(exc)) from None
    raise MalformedMessage(f"unknown message type {kind}")


def _expect_end(data: bytes, end: int) -> None:
    if len(data) != end:
        raise MalformedMessage(f"{len(data)} bytes where {end} were expected")


def _decode_config(data: bytes, offset: int) -> tuple[Config, int]:
    try:
        (count,) = _U16.unpack_from(data, offset)
        offset += 2
        voters: set[str] = set()
        learners: set[str] = set()
        for _ in range(count):
            role, length = data[offset], data[offset + 1]
            offset += 2
            if role > 1 or offset + length > len(data):
                raise MalformedMessage("bad configuration member")
            (learners if role else voters).add(data[offset:offset + length].decode())
            offset += length
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"bad configuration: {exc}") from None
    return Config(frozenset(voters), frozenset(learners)), offset
