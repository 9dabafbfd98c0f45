"""Which member of a durable group reads which shard: a pure function of what is stored.

Shards are spread evenly over the connected members, each keeping what it has where it can
(a move costs a pause of that shard and breaks per-publisher order across the move):

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

from collections.abc import Mapping, Set
from math import ceil

from broker.session.durable.group_records import OWN, REVOKE, Owner

Change = tuple[int, Owner | None, Owner]  # shard, what is stored (None: nothing), new


def rebalance(n_shards: int, owners: Mapping[int, Owner], ready: Set[str],
              stalled: Set[str] = frozenset()) -> list[Change]:
    """The owner changes that move the group towards an even spread over the `ready`
    members; `stalled` ones (connected, but acknowledging nothing) are asked to let go of
    what they hold, as long as a ready member can take it."""
    if not ready:
        return []
    members = sorted(ready)
    cap = ceil(n_shards / len(members))
    load = dict.fromkeys(members, 0)
    changes: list[Change] = []
    free: list[int] = []
    for shard in range(n_shards):
        owner = owners.get(shard)
        if owner is not None and owner.client in stalled:
            if owner.state == OWN:
                changes.append((shard, owner, Owner(owner.client, REVOKE)))
        elif owner is None or owner.client is None or owner.client not in load:
            free.append(shard)  # free, or its owner left: nothing of it is being read
        elif owner.state == OWN and load[owner.client] < cap:
            load[owner.client] += 1
        elif owner.state == OWN:
            changes.append((shard, owner, Owner(owner.client, REVOKE)))
        # revoke: its member's node frees it once it stopped reading
    for shard in free:
        member = min(members, key=lambda m: (load[m], m))
        if load[member] >= cap:
            break
        load[member] += 1
        changes.append((shard, owners.get(shard), Owner(member, OWN)))
    return changes

