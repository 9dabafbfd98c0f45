"""The operator's shard placement (docs/operator-contract.md section 3) as each Durable
Storage group's target: pure.

`placement.json` names, per shard of `messages`, the sites that should hold it, and the
sites that are leaving (their pods go once drained). With builtin_raft every node holds a
replica of every group, as a voter or a learner; a placement decides which: a shard's listed
sites are its voters (at most the replication factor), every other member a learner, and a
leaving site nothing at all, so that once it reports no shard (`GET /api/v5/ds/sites/{site}`)
the operator may remove its pod. Without a file (a cluster from static seeds) the groups'
leaders pick voters from the member list alone (group_members.py).

Sites are compared without regard to case: the operator writes hexadecimal site IDs in
upper case, a broker that made its own writes them in lower case.
"""

import json
from pathlib import Path
from typing import Any, NamedTuple


class PlacementError(ValueError):
    pass


class Target(NamedTuple):
    """What a group's leader steers towards: `voters` None leaves the choice to it."""

    voters: frozenset[str] | None = None
    excluded: frozenset[str] = frozenset()


class Placement(NamedTuple):
    revision: int
    n_shards: int
    shards: dict[int, frozenset[str]]  # lower-case sites
    leaving: frozenset[str]

    def target(self, shard: int | None, members: set[str]) -> Target:
        """For shard `shard` of `messages`, or None for the `sessions` database (which the
        placement does not name: it only keeps leaving sites out). `members` are the
        cluster's sites as the nodes spell them."""
        spelled = {site.lower(): site for site in members}
        excluded = frozenset(spelled[s] for s in self.leaving if s in spelled)
        if shard is None:
            return Target(None, excluded)
        voters = frozenset(spelled[s] for s in self.shards.get(shard, ()) if s in spelled)
        return Target(voters - excluded or None, excluded)


def parse(raw: bytes, n_shards: int) -> Placement:
    """Raises PlacementError for a file this broker cannot follow (then it keeps the
    placement it had)."""
    try:
        doc: Any = json.loads(raw)
    except ValueError as error:
        raise PlacementError(f"not JSON: {error}") from None
    if not isinstance(doc, dict) or doc.get("db", "messages") != "messages":
        raise PlacementError("not a placement of the messages database")
    try:
        revision = int(doc.get("revision", 0))
        count = int(doc["nShards"])
        shards = {int(shard): frozenset(str(site).lower() for site in sites)
                  for shard, sites in dict(doc.get("shards", {})).items()}
        leaving = frozenset(str(site).lower() for site in doc.get("leaving", []))
    except (KeyError, TypeError, ValueError) as error:
        raise PlacementError(f"malformed: {error!r}") from None
    if count != n_shards:
        raise PlacementError(f"nShards is {count}, durable_storage.messages.n_shards"
                             f" {n_shards}: the broker keeps the placement it computes")
    return Placement(revision, count, shards, leaving)


def read(path: Path, n_shards: int) -> Placement | None:
    """None when there is no file (raises PlacementError for a bad one)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise PlacementError(str(error)) from None
    return parse(raw, n_shards)
