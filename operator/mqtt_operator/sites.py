"""Site IDs per pod ordinal: assigned once, never reused or changed.

A site ID names a broker's Durable Storage replica set membership and is checked against
the one kept on the pod's volume; the StatefulSet keeps an ordinal's volume across scale
down, so the ordinal must get the same ID back when it returns, whatever the operator has
been through in between.
"""

import secrets
from collections.abc import Callable, Mapping


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


def merge_known(published: Mapping[str, str] | None,
                recorded: Mapping[str, str] | None) -> dict[int, str]:
    """IDs from the sites ConfigMap (what pods read) win; status fills what the map lost."""
    merged = {int(ordinal): site for ordinal, site in (recorded or {}).items()}
    merged.update({int(ordinal): site for ordinal, site in (published or {}).items()})
    return merged


def as_data(ids: Mapping[int, str]) -> dict[str, str]:
    """ConfigMap data / status map: keys are the ordinals as strings."""
    return {str(ordinal): site for ordinal, site in sorted(ids.items())}
