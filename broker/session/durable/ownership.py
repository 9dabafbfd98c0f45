"""Who may change a durable session in the replicated `sessions` database (builtin_raft).

A session has one owner, the node that serves it, named in its meta with an epoch that
grows each time the session moves. The node that takes a session over writes a claim
first: the meta with its own site and the next epoch. Once a claim is applied, every
replica refuses the writes of the node that held the session before, so a node that was
frozen or cut off while its session moved cannot, when it comes back, overwrite what the
new owner did since (read positions, acknowledgements, QoS 2 state): the claim is the
fencing token of a lease, checked where the writes land, in the log's order. A new session
starts at the wall clock's microseconds, so its epochs stay above those of every earlier
session of its client ID, whose holders may still be writing.

For a command from node W, per session (a meta with no site predates builtin_raft and
belongs to whoever writes it):

- meta deleted (the session ends): admitted if the stored meta names W, or none is stored.
  The replicas then keep the ended session's epoch (its `e` key: a tombstone), with the
  time it ended (the command's serial: W's clock in microseconds; 0 for a command from
  before chains);
- meta written when none is stored: admitted if its epoch is above the tombstone's, if
  any (and the tombstone goes). A node still holding an ended session (frozen or cut off
  while its client moved on and ended it) writes that session's epoch, at most the
  tombstone's, and is refused: admitted, its write would bring the session back, with
  stale state, for the next client of the ID. A new session starts at the wall clock's
  microseconds, above the tombstone;
- meta that creates a session (its `created` flag: the metas a node writes for a session
  it started, until the first one is applied on its replica), when one is stored:
  admitted only if the stored one names W with an epoch no higher (W ended its session and
  started a new one in one command, or the same command came twice: a forwarded command
  whose answer was lost is retried). A creation is never a claim: two CONNECTs of a new
  client ID on two sides of a partition both create the session; the first applied keeps
  it, and the other node learns it lost;
- any other meta written: admitted if its epoch is above the stored one's (a claim), or if
  it keeps the stored epoch and the stored meta names W;
- any other key of the session: admitted if W owns the session before the command, or
  after the command's admitted meta write. Keys of no session (heartbeats) are admitted;
- tombstones are written by the replicas alone, and deleted by a sweep (`sweep_writes`): a
  command carrying a cutoff that deletes those that ended at or before it, so a tombstone
  set again meanwhile (the ID came back and ended again) stays. A sweep refuses nothing.

The client IDs whose writes were refused go back to the writer (when it applies the command
itself): a session it still serves there is not its own any more and must end, or it would
go on acknowledging what no replica records.
"""

from collections.abc import Callable

from broker.session.durable import group_fencing
from broker.session.durable import records as r
from broker.session.durable.group_records import GROUP_KINDS

Write = tuple[bytes, bytes | None]
Owner = tuple[str, int]  # site, epoch
_SESSION_KINDS = frozenset((b"m", b"s", b"p", b"b", b"k", b"r", b"a", b"e"))


def admitted(writer: str, writes: list[Write], stored: Callable[[bytes], bytes | None],
             at: int = 0) -> tuple[list[Write], set[str]]:
    """The writes of one command that its writer may make (with the tombstones they set or
    clear), and the client IDs of the sessions some of whose writes it may not. `at`: the
    command's serial, the time a session it ends ended."""
    before: dict[str, Owner | None] = {}
    after: dict[str, Owner | None] = {}
    refused: set[bytes] = set()
    tombstones: list[Write] = []
    # A sweep's cutoff: tombstones that ended at or before it go.
    cutoff = next((int(value) for key, value in writes
                   if key == r.TOMBSTONE_SWEEP_KEY and value is not None), -1)
    for key, value in writes:
        kind, client_id = r.split_key(key)
        if kind == b"e":
            if value is None and _swept(stored(key), cutoff):
                tombstones.append((key, None))
            continue
        if kind != b"m":
            continue
        current = _owner(stored(key))
        before[client_id] = after[client_id] = current
        new = None if value is None else r.Meta.from_bytes(value)
        ended = _ended(stored(r.ended_key(client_id)))[0] if current is None else None
        if not _meta_admitted(writer, current, new, ended):
            refused.add(key)
            continue
        after[client_id] = None if new is None else (new.site, new.epoch)
        if new is None and current is not None:
            tombstones.append((r.ended_key(client_id),
                               r.dumps({"epoch": current[1], "at": at})))
        elif new is not None and ended is not None:
            tombstones.append((r.ended_key(client_id), None))
    result = []
    refused_ids = {r.split_key(key)[1] for key in refused}

    def site_of(client_id: str) -> str | None:
        owner = _owner(stored(r.meta_key(client_id)))
        return None if owner is None else owner[0]

    ends_group = any(value is None and key[:2] == b"g" + r.SEP for key, value in writes)
    refused_reads, refused_members = group_fencing.refused_units(writer, writes, stored,
                                                                 site_of, ends_group)
    refused_ids |= refused_members
    batches = {key for key, value in writes
               if value is not None and key[:2] == b"b" + r.SEP and key not in refused_reads}
    for key, value in writes:
        kind, client_id = r.split_key(key)
        if kind == b"e" or key == r.TOMBSTONE_SWEEP_KEY:
            continue  # decided above
        if kind == b"m":
            if key not in refused:
                result.append((key, value))
            continue
        if key in refused_reads:
            continue
        if kind in GROUP_KINDS:  # client_id: the group's share
            if group_fencing.admitted(writer, key, value, stored, site_of, batches):
                result.append((key, value))
            continue
        if kind not in _SESSION_KINDS:
            result.append((key, value))
            continue
        if client_id not in before:
            before[client_id] = after[client_id] = _owner(stored(r.meta_key(client_id)))
        if _owns(writer, before[client_id]) or _owns(writer, after[client_id]):
            result.append((key, value))
        else:
            refused_ids.add(client_id)
    return result + tombstones, refused_ids


def sessions_of(writes: list[Write]) -> set[str]:
    """The client IDs of the sessions the writes change."""
    found: set[str] = set()
    for key, _ in writes:
        kind, client_id = r.split_key(key)
        if kind in _SESSION_KINDS:
            found.add(client_id)
    return found


def _owner(raw: bytes | None) -> Owner | None:
    if raw is None:
        return None
    meta = r.Meta.from_bytes(raw)
    return meta.site, meta.epoch


def _owns(writer: str, owner: Owner | None) -> bool:
    return owner is not None and owner[0] in ("", writer)


def sweep_writes(tombstones: list[tuple[bytes, bytes]], cutoff: int) -> list[Write]:
    """A sweep's command: the tombstones (`e` keys and values, as stored) that ended at or
    before `cutoff` (microseconds) deleted, and the cutoff that every replica checks again
    (a tombstone may be set anew before the command applies). Empty when none is due;
    those whose end is unknown (0) are kept."""
    due = [(key, None) for key, raw in tombstones if _swept(raw, cutoff)]
    if not due:
        return []
    return [(r.TOMBSTONE_SWEEP_KEY, str(cutoff).encode()), *due]


def _swept(raw: bytes | None, cutoff: int) -> bool:
    """Whether a sweep with `cutoff` deletes this stored tombstone (none: nothing to delete;
    an unknown end: kept)."""
    return 0 < _ended(raw)[1] <= cutoff


def _ended(raw: bytes | None) -> tuple[int | None, int]:
    """A tombstone's (epoch, time it ended); (None, 0) without one, time 0 when unknown."""
    if raw is None:
        return None, 0
    value = r.loads(raw)
    return int(value["epoch"]), int(value.get("at", 0))


def _meta_admitted(writer: str, current: Owner | None, new: r.Meta | None,
                   ended: int | None) -> bool:
    """`ended`: the tombstone's epoch, when no meta is stored."""
    if current is None:
        return new is None or ended is None or new.epoch > ended
    if new is None:
        return _owns(writer, current)
    if new.created:
        return _owns(writer, current) and new.epoch >= current[1]
    return new.epoch > current[1] or (new.epoch == current[1] and _owns(writer, current))
