"""Which writes of a durable group the replicas of `sessions` admit (builtin_raft).

A shard of a group is read by one member at a time (groups.py); the replicas hold that
line, in the log's order, whatever the nodes believe:

- an owner change (`o`) names the state it replaces and is admitted only if that is the
  state stored: two nodes that both decided (a deposed leader of `sessions` and the new
  one) cannot both hand a shard out, and a member's node frees only a shard it was asked
  to let go of;
- what a member records of a shard, in one command, is judged as one: the group's
  position in a stream (`q`, naming the member that moved it), the member's batches (`b`),
  the returned batches it takes over (`x` deleted): admitted only while the shard is read
  by that member (`own`, or `revoke` until it freed the shard) and from the node that owns
  the member's session; else none of it. So a node that lost the shard while cut off cannot
  move the position or record what another member also reads, a position never moves
  without the batch that read up to it, and a returned batch never goes without the batch
  that takes it over. A refused batch takes its session off that node, as every refused
  write of a session does (ownership.py), so what it read is never sent;
- a member's batch returned to the group (`x`) is written by the node that owns the member's
  session (it leaves or ends there), and only while the batch's record is stored or
  written, admitted, by the same command: a member hands back what was read for it and not
  sent, also of a batch whose record is on its way, and a refused record's deliveries are
  the group's already (read again from its position); the group's keys all go with its
  start (`g` deleted).

The group's start (`g`) is written once: by the first member's node whose write is applied.
Deleting the group's keys is admitted from any node: only the decider ends a group, when it
has no member left.
"""

from collections.abc import Callable

from broker.session.durable import group_records as g
from broker.session.durable import records as r

Stored = Callable[[bytes], bytes | None]
SiteOf = Callable[[str], str | None]  # the site owning a session ("" = any), None: none


Unit = tuple[str, int]  # (share, shard)


def refused_units(writer: str, writes: list[tuple[bytes, bytes | None]], stored: Stored,
                  site_of: SiteOf, ends_group: bool) -> tuple[set[bytes], set[str]]:
    """The keys of a command's reads of groups' shards that are refused, and the members
    whose batches are among them. What a member records of a shard (its batches, the
    group's positions it moves, the returned batches it takes) is judged as one: all of it
    is admitted or none, so a position never moves without the batch that read up to it,
    nor a returned batch goes without the batch that takes it over. Admitted only while
    the shard is read by that member (`own`, or `revoke` until freed) from the writer's
    node."""
    # Per unit: its keys, the members reading, the tenures they read in.
    units: dict[Unit, tuple[list[bytes], set[str], set[int]]] = {}
    for key, value in writes:
        kind, name = r.split_key(key)
        unit: Unit | None = None
        reader: str | None = None
        tenure: int | None = None
        if kind == b"q" and value is not None:
            position = r.loads(value)
            unit, reader = (name, g.position_stream(key).shard), position.get("by")
            tenure = position.get("tenure")
        elif kind == b"x" and value is None and not ends_group:
            unit = (name, g.returned_shard(key, name))
            if stored(key) is None:  # taken already: its taker's batch would double it
                units.setdefault(unit, ([], set(), set()))[1].add("\x00")
        elif kind == b"b" and value is not None and b'"filter":"$share/' in value:
            record = r.BatchRecord.from_bytes(value)
            unit, reader = (record.topic_filter, record.stream.shard), name
        if unit is None:
            continue
        keys, readers, tenures = units.setdefault(unit, ([], set(), set()))
        keys.append(key)
        readers.add(reader or "")
        if tenure is not None:
            tenures.add(tenure)
    refused: set[bytes] = set()
    members: set[str] = set()
    for (share, shard), (keys, readers, tenures) in units.items():
        raw = stored(g.owner_key(share, shard))
        owner = None if raw is None else g.Owner.from_bytes(raw).client
        # A reader U+0000 (no client ID): an `x` taken twice. A tenure not the owner's: a
        # read made in an earlier hold of the shard.
        if owner is None or not _owns(writer, site_of(owner)) or \
                not readers <= {owner, ""} or not tenures <= {g.Owner.tenure_of(raw)}:
            refused.update(keys)
            members.update(reader for reader in readers if reader not in ("", "\x00"))
    return refused, members


def admitted(writer: str, key: bytes, value: bytes | None, stored: Stored,
             site_of: SiteOf, batches: set[bytes]) -> bool:
    """Whether a write of a group's own state is admitted (its reads of a shard: see
    `refused_units`); `batches`: the batch records the same command writes, admitted
    (a record written and deleted again in one flush is in its command twice: kv.py)."""
    kind, share = r.split_key(key)
    if kind == b"o":
        if value is None:
            return True
        raw = stored(key)
        return (None if raw is None else g.Owner.from_bytes(raw)) == g.Owner.prev_of(value)
    if kind == b"x" and value is not None:
        client_id = g.returned_client(key, share)
        batch = r.batch_key(client_id, g.returned_from_bytes(value)[0].first_seqno)
        if not _owns(writer, site_of(client_id)):
            return False
        return batch in batches or stored(batch) is not None
    if kind == b"g":  # the first member's start is the group's
        return value is None or stored(key) is None
    return True


def _owns(writer: str, site: str | None) -> bool:
    return site is not None and site in ("", writer)
