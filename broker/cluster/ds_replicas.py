"""The sites an administrator chose to hold the `messages` database's votes (`broker ctl ds
join | leave | set-replicas`, as `emqx ctl ds` names them): pure.

The choice is one key of the replicated `sessions` database, so every node reads the same
one and each shard's leader steers its group towards it (group_members.next_change): the
voters of every shard are picked among the chosen sites, at most the replication factor of
them; every other member keeps a learner's copy, from which its durable sessions read. With
no choice stored (None) every member may vote. The operator's placement file, where there
is one, decides instead, and the verbs are refused.

`forget` is not here: it removes a site from the cluster itself (membership.py).
"""

import json
from typing import Final

from broker.cluster.placement import Target

KEY: Final = b"Z\x00ds_replicas\x00messages"  # kind "Z": no session's key (ownership.py)
DB: Final = "messages"


class ReplicasRefused(ValueError):
    """The request cannot be carried out as asked; the message says why."""


def encode(sites: frozenset[str]) -> bytes:
    return json.dumps(sorted(sites)).encode()


def decode(raw: bytes | None) -> frozenset[str] | None:
    if raw is None:
        return None
    try:
        sites = json.loads(raw)
    except ValueError:
        return None
    return frozenset(str(site) for site in sites) if isinstance(sites, list) else None


def spell(site: str, members: set[str]) -> str:
    """`site` as the cluster spells it (site IDs compare without regard to case)."""
    for member in members:
        if member.lower() == site.lower():
            return member
    raise ReplicasRefused(f"site {site!r} is not a member of the cluster")


def set_replicas(sites: list[str], members: set[str]) -> frozenset[str]:
    chosen = frozenset(spell(site, members) for site in sites)
    if not chosen:
        raise ReplicasRefused("at least one site must hold the database")
    return chosen


def join(current: frozenset[str] | None, site: str, members: set[str]) -> frozenset[str]:
    return (current if current is not None else frozenset(members)) | {spell(site, members)}


def leave(current: frozenset[str] | None, site: str, members: set[str]) -> frozenset[str]:
    remaining = (current if current is not None else frozenset(members)) - {
        spell(site, members)}
    if not remaining:
        raise ReplicasRefused("the last site holding the database cannot leave it")
    return remaining


def replicas(current: frozenset[str] | None, members: set[str]) -> list[str]:
    """The sites that may vote, as `GET .../replicas` lists them."""
    return sorted(members if current is None else current & members)


def target(current: frozenset[str] | None, members: set[str]) -> Target:
    if current is None:
        return Target()
    return Target(frozenset(current & members) or None)
