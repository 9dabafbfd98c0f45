"""Durable sessions that no running node serves, read from this node's replica of the
replicated `sessions` database.

A durable session lives in memory on the node that owns it (the site its meta names), and
every node's replica holds its state. When that node is down, no node lists the session,
yet it is there: it resumes when its client connects to any node (which takes it over) or
expires. So the dashboard lists it from here, with what the replica tells: expiry, its
subscriptions (to count what it missed) and since when it is away: when its client left,
or, for a client that was connected when its node died, the node's last heartbeat (what
the node itself would take on restart).

With node-local storage no other node's session is in this node's database: nothing is
listed.
"""

from dataclasses import dataclass
from functools import partial

from broker.ds.kv import KVStore
from broker.session.durable import records as r
from broker.session.durable.orphans import away_since


@dataclass(frozen=True, slots=True)
class Unserved:
    client_id: str
    site: str  # the owner, down or no longer a member
    meta: r.Meta
    since: dict[str, int]  # subscription filter -> from when (microseconds) it is stored
    away_since: float | None  # wall clock; None when the replica cannot tell


def unserved(sessions: KVStore, served: set[str]) -> list[Unserved]:
    """Every session whose owner is not in `served` (this node and its linked peers), by
    client ID. A meta without a site predates replication and is this node's own."""
    found = []
    for key, value in sessions.scan(r.SEP.join((b"m", b""))):
        _kind, client_id = r.split_key(key)
        meta = r.Meta.from_bytes(value)
        if not meta.site or meta.site in served:
            continue
        subscriptions = r.prefix(b"s", client_id)
        since = {sub_key[len(subscriptions):].decode(): r.subscription_from_bytes(raw)[1]
                 for sub_key, raw in sessions.scan(subscriptions)}
        found.append(Unserved(client_id, meta.site, meta, since,
                              away_since(meta, partial(_heartbeat, sessions))))
    return sorted(found, key=lambda session: session.client_id)


def _heartbeat(sessions: KVStore, site: str) -> float | None:
    raw = sessions.get(r.heartbeat_key(site))
    return float(raw) if raw is not None else None
