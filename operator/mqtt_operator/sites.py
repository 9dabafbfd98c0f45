"""Site IDs per pod ordinal: assigned once, never reused, changed only with the volume.

A site ID names a broker's Durable Storage replica set membership and is checked against
the one kept on the pod's volume; the StatefulSet keeps an ordinal's volume across scale
down, so the ordinal must get the same ID back when it returns, whatever the operator has
been through in between. A site lives on one volume: each ID is bound to the UID of the
claim (PVC) it was first seen on, and an ordinal whose claim was replaced (the volume lost)
gets a new ID, since brokers refuse a known site back without its data ("reborn").
"""

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass


def new_site_id() -> str:
    """16 lower-case hex digits: the form a broker gives itself when nothing names its site
    (broker/ds/site.py), so one cluster never mixes two spellings. IDs assigned before in
    upper case are kept as they are: a pod's data dir and its peers hold them verbatim."""
    return secrets.token_hex(8)


def assign(known: Mapping[int, str], width: int,
           new_id: Callable[[], str] = new_site_id) -> dict[int, str]:
    """Every ordinal below `width` gets an ID; known ones (also those above width) are kept."""
    ids = dict(known)
    taken = set(ids.values())
    for ordinal in range(width):
        if ordinal not in ids:
            site = new_id()
            while site in taken:
                site = new_id()
            ids[ordinal] = site
            taken.add(site)
    return dict(sorted(ids.items()))


@dataclass(frozen=True)
class Rebound:
    ids: dict[int, str]
    claims: dict[int, str]  # ordinal -> UID of the claim its site is bound to
    replaced: dict[int, str]  # ordinal -> its previous site, gone with its volume


def rebind(ids: Mapping[int, str], bound: Mapping[int, str], claims: Mapping[int, str],
           new_id: Callable[[], str] = new_site_id) -> Rebound:
    """Binds each ordinal's site to the claim that exists now (`claims`: ordinal -> UID); an
    ordinal bound to another claim gets a new site. A site never bound keeps its ID: its
    claim is the first one it is seen with (clusters made before binding, and new ordinals,
    whose claim the StatefulSet creates with the pod)."""
    new_ids, new_bound = dict(ids), dict(bound)
    replaced = {}
    for ordinal, claim in sorted(claims.items()):
        if ordinal not in new_ids:
            continue
        if new_bound.get(ordinal, claim) != claim:
            replaced[ordinal] = new_ids.pop(ordinal)
            new_ids.update(assign(new_ids, ordinal + 1, new_id))
        new_bound[ordinal] = claim
    return Rebound(dict(sorted(new_ids.items())), new_bound, replaced)


CLAIM_PREFIX = "claim-"  # ConfigMap keys next to the ordinals': claim-<ordinal> -> UID


def merge_known(published: Mapping[str, str] | None,
                recorded: Mapping[str, str] | None) -> dict[int, str]:
    """IDs from the sites ConfigMap (what pods read) win; status fills what the map lost."""
    merged = {int(ordinal): site for ordinal, site in (recorded or {}).items()}
    merged.update({int(ordinal): site for ordinal, site in (published or {}).items()
                   if ordinal.isdigit()})
    return merged


def bound_claims(published: Mapping[str, str] | None) -> dict[int, str]:
    """ordinal -> claim UID, from the sites ConfigMap."""
    return {int(key.removeprefix(CLAIM_PREFIX)): uid for key, uid in (published or {}).items()
            if key.startswith(CLAIM_PREFIX)}


def as_data(ids: Mapping[int, str]) -> dict[str, str]:
    """Status map: keys are the ordinals as strings."""
    return {str(ordinal): site for ordinal, site in sorted(ids.items())}


def as_map_data(ids: Mapping[int, str], claims: Mapping[int, str]) -> dict[str, str]:
    """The sites ConfigMap: ordinal -> site (the file a pod reads) and claim-<ordinal> ->
    the claim UID that site is bound to."""
    return {**as_data(ids), **{f"{CLAIM_PREFIX}{ordinal}": uid
                               for ordinal, uid in sorted(claims.items())}}
