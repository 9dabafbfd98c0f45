"""Which member of a durable group reads which shard: a pure function of what is stored.

Shards are spread evenly over the connected members (each n_shards // members of them, or
one more), each keeping what it has where it can (a move costs a pause of that shard and
breaks per-publisher order across the move):

- a shard whose owner is not a connected member any more goes straight to another one: a
  member that is not connected reads nothing (its node stopped its readers before it wrote
  that the client left), so nothing of that shard is in flight elsewhere;
- a connected member holding more than its share is asked to let go of the extra (`revoke`):
  its node stops reading them, waits for its batch records, and frees them; only a free
  shard is handed to another member (so no two members ever read a shard at once);
- a connected member whose client acknowledges nothing while its window is full (stalled)
  is asked to let go of every shard, so it holds back no more than its window;
- with no connected member, nothing moves: the messages wait in storage.
"""

import heapq
from collections.abc import Mapping, Set

from broker.session.durable.group_records import OWN, REVOKE, Owner

Change = tuple[int, Owner | None, Owner]  # shard, what is stored (None: nothing), new


def rebalance(n_shards: int, owners: Mapping[int, Owner], ready: Set[str],
              stalled: Set[str] = frozenset()) -> list[Change]:
    """The owner changes that move the group towards an even spread over the `ready`
    members (each n_shards // members, the n_shards % members that hold most now one
    more); `stalled` ones (connected, but acknowledging nothing) are asked to let go of
    what they hold, as long as a ready member can take it. Costs the shards and the members
    that hold or get one, not every member: with more members than shards (a group of 10,000
    decided again as each one comes or goes) the others are passed over in one pass at C
    speed (`heapq.nsmallest`)."""
    if not ready:
        return []
    held: dict[str, list[int]] = {}
    changes: list[Change] = []
    free: list[int] = []
    for shard in range(n_shards):
        owner = owners.get(shard)
        if owner is not None and owner.client in stalled:
            if owner.state == OWN:
                changes.append((shard, owner, Owner(owner.client, REVOKE)))
        elif owner is None or owner.client is None or owner.client not in ready:
            free.append(shard)  # free, or its owner left: nothing of it is being read
        elif owner.state == OWN:
            held.setdefault(owner.client, []).append(shard)
        # revoke: its member's node frees it once it stopped reading
    base, extra = divmod(n_shards, len(ready))
    # Those that hold most rank first, then by name; only the first `extra` get one more
    # than `base`, so with `base` 0 the members ranked after them get nothing.
    ranked = sorted(held, key=lambda m: (-len(held[m]), m))
    wanted = len(ready) if base else extra
    if len(ranked) < wanted:
        ranked += heapq.nsmallest(wanted - len(ranked), ready - held.keys())
    quota = {member: base + (rank < extra) for rank, member in enumerate(ranked)}
    load = {}
    for member in ranked:
        shards = held.get(member, [])
        for shard in shards[quota[member]:]:
            changes.append((shard, owners[shard], Owner(member, REVOKE)))
        load[member] = min(len(shards), quota[member])
    for shard in free:
        member = min(ranked, key=lambda m: (load[m] - quota[m], m))
        if load[member] >= quota[member]:
            break
        load[member] += 1
        changes.append((shard, owners.get(shard), Owner(member, OWN)))
    return changes
