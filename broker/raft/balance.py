"""Which group a node hands over so that the Raft groups' leaderships spread over the nodes.

Why: leadership goes where elections and transfers put it. A rolling restart moves every
group off the node that stops (graceful stops hand over) and none come back, so after it
one node leads most groups and carries their appends, fsyncs and applies while the others
idle (RabbitMQ answers this with `rabbitmq-queues rebalance`; here it runs by itself,
`durable_storage.raft.leader_balance_interval`).

Each node decides alone, from what it sees of the groups it is a voter of, and only about
the groups it leads: each goes to a voter leading at least two fewer groups than this node
(counting the moves already planned). Every such move lowers the sum of squares of the
counts, so rounds converge; two nodes planning at once towards the same one can overshoot,
which the next round evens out.
"""

from collections import Counter
from collections.abc import Callable, Mapping

# group -> (its leader's id or None, its voters), as one node sees them
Groups = Mapping[int, tuple[str | None, frozenset[str]]]


def leader_counts(groups: Groups) -> Counter[str]:
    """Groups led per voter of any of `groups` (0 for those leading none)."""
    counts: Counter[str] = Counter({voter: 0 for _, voters in groups.values()
                                    for voter in voters})
    counts.update(leader for leader, _ in groups.values() if leader is not None)
    return counts


def moves(me: str, groups: Groups, can_lead: Callable[[str], bool]) -> list[tuple[int, str]]:
    """(group, voter) pairs for `me` to hand over now, each to a voter leading at least two
    fewer groups than `me` at that point of the plan (counts updated move by move, the
    least loaded voter first); empty when its share is fair."""
    counts = leader_counts(groups)
    led = sorted(group for group, (leader, _) in groups.items() if leader == me)
    planned: list[tuple[int, str]] = []
    for group in led:
        targets = [(counts[voter], voter) for voter in sorted(groups[group][1] - {me})
                   if counts[me] - counts[voter] >= 2 and can_lead(voter)]
        if not targets:
            continue
        _, target = min(targets)
        planned.append((group, target))
        counts[me] -= 1
        counts[target] += 1
    return planned
