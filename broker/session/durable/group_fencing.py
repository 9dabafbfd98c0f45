"""Which writes of a durable group the replicas of `sessions` admit (builtin_raft).

A shard of a group is read by one member at a time (groups.py); the replicas hold that
line, in the log's order, whatever the nodes believe:

- an owner change (`o`) names the state it replaces and is admitted only if that is the
  state stored: two nodes that both decided (a deposed leader of `sessions` and the new
  one) cannot both hand a shard out, and a member's node frees only a shard it was asked
  to let go of;
- the group's position in a stream (`q`) moves, and a batch of a member's shared
  subscription is recorded (`b`), only by the node that owns the session of the shard's
  member (`own`, or `revoke` until it freed the shard): a node that lost the shard while
  cut off cannot move the position back or record what the new member also reads. A
  refused batch takes its session off that node, as every refused write of a session
  does (ownership.py), so what it read is never sent;
- a member's batch returned to the group (`x`) is written by the node that owns the member's
  session (it ends there), and taken (deleted) by the node owning the session of the
  shard's member, or with the group (its start, `g`, deleted in the same command).

The group's start (`g`) is written once: by the first member's node whose write is applied.
Deleting the group's keys is admitted from any node: only the decider ends a group, when it
has no member left.
"""

from collections.abc import Callable

from broker.session.durable import group_records as g
from broker.session.durable import records as r

Stored = Callable[[bytes], bytes | None]
SiteOf = Callable[[str], str | None]  # the site owning a session ("" = any), None: none


def admitted(writer: str, key: bytes, value: bytes | None, stored: Stored,
             site_of: SiteOf, ends_group: bool) -> bool:
    """Whether one group key's write (not a session's: see `batch_admitted`) is admitted."""
    kind, share = r.split_key(key)
    if kind == b"o":
        if value is None:
            return True
        raw = stored(key)
        return (None if raw is None else g.Owner.from_bytes(raw)) == g.Owner.prev_of(value)
    if kind == b"q":
        return value is None or _reads(writer, share, g.position_stream(key).shard, None,
                                       stored, site_of)
    if kind == b"x":
        if value is not None:
            return _owns(writer, site_of(g.returned_client(key, share)))
        return ends_group or _reads(writer, share, g.returned_shard(key, share), None, stored,
                                    site_of)
    if kind == b"g":  # the first member's start is the group's
        return value is None or stored(key) is None
    return True


def batch_admitted(writer: str, client_id: str, value: bytes | None, stored: Stored,
                   site_of: SiteOf) -> bool:
    """Whether a member's batch record (`b`) is admitted: one of a shared subscription only
    while the member reads the stream's shard for its group, from the writer's node."""
    if value is None or b'"filter":"$share/' not in value:
        return True
    record = r.BatchRecord.from_bytes(value)
    if not record.topic_filter.startswith("$share/"):
        return True
    return _reads(writer, record.topic_filter, record.stream.shard, client_id, stored, site_of)


def _reads(writer: str, share: str, shard: int, client_id: str | None, stored: Stored,
           site_of: SiteOf) -> bool:
    raw = stored(g.owner_key(share, shard))
    if raw is None:
        return False
    owner = g.Owner.from_bytes(raw)
    if owner.client is None or (client_id is not None and owner.client != client_id):
        return False
    return _owns(writer, site_of(owner.client))


def _owns(writer: str, site: str | None) -> bool:
    return site is not None and site in ("", writer)
