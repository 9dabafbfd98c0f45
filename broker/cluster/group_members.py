"""Which membership change a group's leader makes next, from the cluster's member list: pure.

Every node hosts the metadata group, so the group follows the cluster: a running node that
is not a member is added as a learner (it replicates, it does not vote); a learner that has
caught up is promoted while there are fewer than `voter_cap` voters (VOTER_CAP for the
metadata group, the replication factor for Durable Storage's); a member the cluster no
longer lists (it left, was force-removed, or was down past `cluster.autoclean`) is removed.
Removals come first, so a freed voter's place goes to a learner. With a target
(the operator's placement.py, or an administrator's ds_replicas.py) Durable Storage's shards
vote where it says, and leaving sites are removed.
One change at a time: the core accepts the next once the previous one committed.

Beyond VOTER_CAP voters a commit waits for more acknowledgements and elections get slower,
for no more safety than 2 failures tolerated; the other nodes are learners, which still hold
a full copy for their local reads.
"""

from broker.cluster.bootstrap import VOTER_CAP
from broker.cluster.placement import Target

__all__ = ["ADD", "PROMOTE", "REMOVE", "VOTER_CAP", "next_change"]
from broker.raft.messages import Config

NO_TARGET = Target()
ADD = "add"
PROMOTE = "promote"
REMOVE = "remove"


def next_change(config: Config, leader: str, running: set[str], known: set[str],
                caught_up: set[str], voter_cap: int = VOTER_CAP,
                target: Target = NO_TARGET) -> tuple[str, str] | None:
    """(ADD | PROMOTE | REMOVE, site) or None. `running`: peers with a link up; `known`:
    every member of the cluster (running or down), `caught_up`: learners close enough to
    the leader's log to vote; `target` (placement.py): the sites that should vote, and
    those that should hold nothing (the leader too: it steps down once its removal
    commits)."""
    members = config.members()
    gone = (members - known - {leader}) | (members & target.excluded)
    if gone:
        return REMOVE, min(gone)
    new = running - members - {leader} - target.excluded
    if new:
        return ADD, min(new)
    ready = config.learners & running & caught_up
    wanted = target.voters
    if wanted is not None:
        ready &= wanted
    if ready and len(config.voters) < voter_cap:
        return PROMOTE, min(ready)
    if wanted is None:
        return None
    extra = config.voters - wanted
    if extra and (ready or not wanted - config.voters):
        # A voter the target does not name gives up its vote (and comes back as a learner):
        # once a named learner can take its place, or at once when no named site is waiting
        # for one (the target shrinks the voters).
        return REMOVE, min(extra)
    return None
