"""Acting on one client, and what durable sessions miss while away (EMQX's API shape).

`DELETE /api/v5/clients/{clientid}` is EMQX's kick: the connection is closed (a v5 client is
told Administrative action, 0x98) and the session discarded, durable or not, so an offline
durable session can be cleared this way too. It acts on this node's sessions: a client on
another node is named as such, and one that is gone gets a 404 that says so.

`GET /api/v5/durable_sessions` lists this node's durable sessions with what the dashboard
shows beside `/api/v5/clients`: when an offline one expires and how many stored messages
match its subscriptions since its client left (`missed_cnt`, broker/http/missed.py: up to
MISSED_CAP per session, `missed_capped` past it), counted for the page asked for only.
"""

import time
from typing import Any, Final

from aiohttp import web

from broker.http.api import GATHER_KEY, NODE_KEY, _page, local_subscriptions
from broker.http.missed import MissedCounts
from broker.mqtt.constants import ReasonCode
from broker.session.durable.session import DurableSession

MISSED_CAP: Final = 10_000
MISSED_KEY: Final = web.AppKey("missed_counts", MissedCounts)
NEVER_EXPIRES: Final = 0xFFFFFFFF


def _not_found(client_id: str, message: str) -> web.Response:
    return web.json_response({"code": "CLIENTID_NOT_FOUND", "message": message.format(client_id)},
                             status=404)


async def kick(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    client_id = request.match_info["clientid"]
    session = node.sessions.sessions.get(client_id)
    if session is None:
        gather = request.app.get(GATHER_KEY)
        elsewhere = await gather("client", client_id) if gather is not None else []
        if elsewhere:
            return _not_found(client_id, "client {!r} is on node " + elsewhere[0]["node"]
                              + ": kick it through that node's API")
        return _not_found(client_id, "client {!r} is already gone: not connected and no"
                          " session kept")
    connection = session.connection
    if connection is not None:
        connection.take_over(ReasonCode.ADMINISTRATIVE_ACTION)  # detaches the session now
    node.sessions.end(session)
    return web.Response(status=204)


async def client_subscriptions(request: web.Request) -> web.Response:
    """EMQX answers this one with a plain list, not a page."""
    node = request.app[NODE_KEY]
    client_id = request.match_info["clientid"]
    if client_id in node.sessions.sessions:
        return web.json_response(local_subscriptions(node, client_id))
    gather = request.app.get(GATHER_KEY)
    found = await gather("subscriptions", client_id) if gather is not None else []
    if not found and (gather is None or not await gather("client", client_id)):
        return _not_found(client_id, "client {!r} not found")
    return web.json_response(found)


def _expires_at(session: DurableSession) -> float | None:
    if (session.connection is not None or session.disconnected_at is None
            or session.expiry_interval == NEVER_EXPIRES):
        return None
    return session.disconnected_at + session.expiry_interval


def _view(node_name: str, session: DurableSession) -> dict[str, Any]:
    return {
        "clientid": session.client_id,
        "node": node_name,
        "connected": session.connection is not None,
        "proto_ver": session.protocol,
        "expiry_interval": session.expiry_interval,
        "disconnected_at": session.disconnected_at,
        "expires_at": _expires_at(session),
        "subscriptions_cnt": len(session.subscriptions),
        "inflight_cnt": len(session.inflight),
        "checkpoint_lag": session.backlog(),
    }


async def durable_sessions(request: web.Request) -> web.Response:
    """`?connected=false` for the offline ones only; `missed_capped` says a count stopped
    at MISSED_CAP."""
    node = request.app[NODE_KEY]
    wanted = request.query.get("connected")
    durable = [s for s in node.sessions.sessions.values() if isinstance(s, DurableSession)]
    sessions = sorted(
        (s for s in durable
         if wanted is None or (s.connection is not None) == (wanted == "true")),
        key=lambda s: s.client_id)
    counts = request.app.get(MISSED_KEY)
    if counts is not None:
        counts.forget_all_but({s.client_id for s in durable if s.connection is None})
    by_id = {s.client_id: s for s in sessions}

    def finish(items: list[dict[str, Any]]) -> None:
        """Counted for the page's sessions only; `now` beside `expires_at` so the page
        counts down by the broker's clock, not its own."""
        now = time.time()
        for item in items:
            count = counts.count(by_id[item["clientid"]]) if counts is not None else 0
            item.update(missed_cnt=count, missed_capped=count >= MISSED_CAP, now=now)

    return _page(request, [_view(node.config["node.name"], s) for s in sessions], finish)


def add_client_admin_routes(app: web.Application) -> None:
    ds = app[NODE_KEY].ds
    if ds is not None:
        app[MISSED_KEY] = MissedCounts(ds, MISSED_CAP)
    app.router.add_delete("/api/v5/clients/{clientid}", kick)
    app.router.add_get("/api/v5/clients/{clientid}/subscriptions", client_subscriptions)
    app.router.add_get("/api/v5/durable_sessions", durable_sessions)
