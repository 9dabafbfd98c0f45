"""Durable sessions whose node is gone (replicated `sessions` database, builtin_raft).

A session's expiry timer runs on the node that owns it. When that node is down for good
(killed with its volume, forgotten with `broker ctl ds forget`) nothing ends the session:
its subscriptions keep every node storing messages for a client that will never read them.
So the leader of the `sessions` group ends, in the sweep, the sessions of nodes that are
not up once they expired by what the replicas know: disconnected since the time the meta
says, or, for a session whose client was connected when its node fell silent, since that
node's last heartbeat. A node merely cut off from the majority loses nothing it could have
kept: its writes cannot commit there, and its client can resume the session on any node
until it expires.
"""

from collections.abc import Callable, Iterable

from broker.mqtt.constants import MAX_UINT32
from broker.session.durable.records import Meta


def away_since(meta: Meta, heartbeat: Callable[[str], float | None]) -> float | None:
    """Since when the client of a session whose node is down has been away: since it left,
    or, if it was connected when its node fell silent, since that node's last `heartbeat`
    (what the node itself would take on restart); None when the replica cannot tell."""
    return heartbeat(meta.site) if meta.connected else meta.disconnected_at


def expired_orphans(metas: Iterable[tuple[str, Meta]],
                    heartbeat: Callable[[str], float | None],
                    is_up: Callable[[str], bool], now: float, ttl: float) -> list[str]:
    """Client IDs of the sessions owned by a site that is not up that expired by `now`:
    `heartbeat` gives a site's last one (wall clock), `ttl` the time a session that never
    expires is kept after its client left (0: forever)."""
    expired = []
    for client_id, meta in metas:
        if not meta.site or is_up(meta.site):
            continue
        since = away_since(meta, heartbeat)
        if since is None:
            continue  # no sign of its node at all: nothing to count from
        limit = ttl if meta.expiry_interval == MAX_UINT32 else meta.expiry_interval
        if limit and now - since >= limit:
            expired.append(client_id)
    return expired
