"""`GET /api/v5/durable_sessions`: durable sessions with what the dashboard shows beside
`/api/v5/clients`: when an offline one expires and how many stored messages match its
subscriptions since its client left (`missed_cnt`, broker/http/missed.py: up to MISSED_CAP
per session, `missed_capped` past it), counted for the page asked for only.

By default a node lists the sessions it serves (`kubectl mqtt sessions` asks each pod).
`?cluster=true` lists the whole cluster's, as the dashboard wants: this node's, each linked
peer's (asked over RPC, and asked again for the missed counts of the page's sessions it
serves: a session's count is read where it is served), and those whose node is down, from
this node's replica of the sessions database (broker/http/unserved.py), counted here.
Each item says whether a running node serves it (`served`).
"""

import time
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web

from broker.http.common import NODE_KEY, PEERS_KEY, gather, page_of, paged, paging
from broker.http.missed import MissedCounts
from broker.http.unserved import Unserved, unserved
from broker.node import Node
from broker.session.durable.session import DurableSession

MISSED_CAP: Final = 10_000
# Counts of the sessions this node serves, and of those no running node serves (each kept
# for the sessions of its kind only).
MISSED_KEY: Final = web.AppKey("missed_counts", MissedCounts)
UNSERVED_MISSED_KEY: Final = web.AppKey("unserved_missed_counts", MissedCounts)
NEVER_EXPIRES: Final = 0xFFFFFFFF


def _expires_at(away_since: float | None, expiry_interval: int) -> float | None:
    if away_since is None or expiry_interval == NEVER_EXPIRES:
        return None
    return away_since + expiry_interval


def _away_since(session: DurableSession) -> float | None:
    return session.disconnected_at if session.connection is None else None


def _view(node_name: str, session: DurableSession) -> dict[str, Any]:
    return {
        "clientid": session.client_id,
        "node": node_name,
        "served": True,
        "connected": session.connection is not None,
        "proto_ver": session.protocol,
        "expiry_interval": session.expiry_interval,
        "disconnected_at": session.disconnected_at,
        "expires_at": _expires_at(_away_since(session), session.expiry_interval),
        "subscriptions_cnt": len(session.subscriptions),
        "inflight_cnt": len(session.inflight),
        "checkpoint_lag": session.backlog(),
    }


def _unserved_view(node_name: str, session: Unserved) -> dict[str, Any]:
    meta = session.meta
    return {
        "clientid": session.client_id, "node": node_name, "served": False, "connected": False,
        "proto_ver": meta.protocol, "expiry_interval": meta.expiry_interval,
        "disconnected_at": session.away_since,
        "expires_at": _expires_at(session.away_since, meta.expiry_interval),
        "subscriptions_cnt": len(session.since), "inflight_cnt": None, "checkpoint_lag": None,
    }


def _served_here(node: Node, connected: str | None) -> list[DurableSession]:
    """`connected`: the query's filter, "true" or "false" (None: both). The connected ones
    are all in memory: those out of memory are read from disk only when asked for."""
    sessions = node.sessions
    every = sessions.sessions.values() if connected == "true" else sessions.every()
    return [s for s in every if isinstance(s, DurableSession)
            and (connected is None or (s.connection is not None) == (connected == "true"))]


def _offline_ids(node: Node) -> set[str]:
    sessions = node.sessions
    return {s.client_id for s in sessions.sessions.values()
            if isinstance(s, DurableSession) and s.connection is None} | set(sessions.offline.ids())


def local_views(node: Node, counts: MissedCounts | None,
                connected: str | None) -> list[dict[str, Any]]:
    """This node's sessions; also what a peer's `durable_sessions` call answers. Drops the
    counts of sessions no longer offline here (resumed, ended, moved)."""
    if counts is not None:
        counts.forget_all_but(_offline_ids(node))
    name = node.config["node.name"]
    return [_view(name, s) for s in _served_here(node, connected)]


def _count(counts: MissedCounts, session: DurableSession) -> int:
    # A shared subscription has no `since`: it is routed live and never stored.
    since = {f: session.since[f] for f in session.subscriptions if f in session.since}
    return counts.count(session.client_id, _away_since(session), since)


def local_missed(node: Node, counts: MissedCounts | None,
                 client_ids: list[str]) -> list[dict[str, Any]]:
    """Missed counts of those of `client_ids` this node serves; what a peer's `missed` call
    answers."""
    found = []
    for client_id in client_ids:
        session = node.sessions.peek(client_id)
        if isinstance(session, DurableSession) and counts is not None:
            found.append({"clientid": client_id, "missed_cnt": _count(counts, session)})
    return found


def _unserved_here(request: web.Request) -> dict[str, tuple[str, Unserved]]:
    """Client ID -> (node name, session) of the sessions no running node serves."""
    node, peers = request.app[NODE_KEY], request.app.get(PEERS_KEY)
    if node.ds is None or peers is None:
        return {}
    sessions = unserved(node.ds.sessions, peers.linked() | {node.ds.site_id})
    return {s.client_id: (peers.name_of(s.site), s) for s in sessions}


async def durable_sessions(request: web.Request) -> web.Response:
    """`?connected=false` for the offline ones only."""
    node = request.app[NODE_KEY]
    page, limit = paging(request)
    connected = request.query.get("connected")
    name = node.config["node.name"]
    here = {s.client_id: s for s in _served_here(node, connected)}
    items = local_views(node, request.app.get(MISSED_KEY), connected)
    away: dict[str, tuple[str, Unserved]] = {}
    if request.query.get("cluster") == "true":
        items += await gather(request, "durable_sessions", connected)
        if connected != "true":
            away = _unserved_here(request)
            items += [_unserved_view(owner, s) for owner, s in away.values()]
            unserved_counts = request.app.get(UNSERVED_MISSED_KEY)
            if unserved_counts is not None:
                unserved_counts.forget_all_but(set(away))
    items.sort(key=lambda item: (item["clientid"], item["node"]))
    data = page_of(items, page, limit)
    await _count_missed(request, data, here, away, name)
    return paged(data, page, limit, len(items))


async def _count_missed(request: web.Request, data: list[dict[str, Any]],
                        here: Mapping[str, DurableSession],
                        away: Mapping[str, tuple[str, Unserved]], name: str) -> None:
    """Fills in the page's missed counts; `now` beside `expires_at` so the page counts down
    by the broker's clock, not its own. A peer that does not answer leaves its counts None."""
    counts, unserved_counts = request.app.get(MISSED_KEY), request.app.get(UNSERVED_MISSED_KEY)
    elsewhere = [item["clientid"] for item in data
                 if item["served"] and item["node"] != name and not item["connected"]]
    remote = ({found["clientid"]: found["missed_cnt"]
               for found in await gather(request, "missed", elsewhere)} if elsewhere else {})
    now = time.time()
    for item in data:
        client_id = item["clientid"]
        count: int | None = 0
        if counts is not None and item["node"] == name and client_id in here:
            count = _count(counts, here[client_id])
        elif unserved_counts is not None and not item["served"]:
            session = away[client_id][1]
            count = unserved_counts.count(client_id, session.away_since, session.since)
        elif item["node"] != name and not item["connected"]:
            count = remote.get(client_id)
        item.update(missed_cnt=count, missed_capped=count is not None and count >= MISSED_CAP,
                    now=now)


def add_durable_session_routes(app: web.Application) -> None:
    ds = app[NODE_KEY].ds
    if ds is not None:
        app[MISSED_KEY] = MissedCounts(ds, MISSED_CAP)
        app[UNSERVED_MISSED_KEY] = MissedCounts(ds, MISSED_CAP)
    app.router.add_get("/api/v5/durable_sessions", durable_sessions)
