"""What the HTTP API's route modules share: the application's keys, EMQX's paging, the
views of clients and subscriptions, and asking every node of a cluster. Below the route
modules (api.py and the *_api.py files), so that they import it, never each other.
"""

from typing import Any, Protocol

from aiohttp import web

from broker.node import Node
from broker.session.session import Session

NODE_KEY = web.AppKey("node", Node)


def client_view(node: Node, session: Session) -> dict[str, Any]:
    connection = session.connection
    return {
        "clientid": session.client_id,
        "node": node.config["node.name"],
        "connected": connection is not None,
        "proto_ver": connection.version if connection else None,
        "clean_start": connection.clean_start if connection else False,
        "keepalive": connection.keepalive if connection else None,
        "ip_address": connection.peer if connection else None,
        "expiry_interval": session.expiry_interval,
        "durable": session.durable,
        "subscriptions_cnt": len(session.subscriptions),
        "inflight_cnt": len(session.inflight),
        "mqueue_len": session.queued,
        "awaiting_rel_cnt": len(session.awaiting_rel),
    }


def paging(request: web.Request) -> tuple[int, int]:
    """EMQX's `page` (from 1) and `limit` (up to 10000) of a list request."""
    try:
        page = max(1, int(request.query.get("page", "1")))
        limit = max(1, min(10_000, int(request.query.get("limit", "100"))))
    except ValueError:
        raise web.HTTPBadRequest(
            text='{"code": "BAD_REQUEST", "message": "page and limit must be integers"}',
            content_type="application/json") from None
    return page, limit


def page_of(items: list[dict[str, Any]], page: int, limit: int) -> list[dict[str, Any]]:
    return items[(page - 1) * limit:page * limit]


def paged(data: list[dict[str, Any]], page: int, limit: int, count: int) -> web.Response:
    """EMQX's paging envelope."""
    return web.json_response({"data": data,
                              "meta": {"page": page, "limit": limit, "count": count}})


def page(request: web.Request, items: list[dict[str, Any]]) -> web.Response:
    page, limit = paging(request)
    return paged(page_of(items, page, limit), page, limit, len(items))


def local_clients(node: Node) -> list[dict[str, Any]]:
    return [client_view(node, s) for s in node.sessions.every()]


def local_subscriptions(node: Node, wanted: str | None) -> list[dict[str, Any]]:
    items = []
    if wanted is None:
        sessions = list(node.sessions.every())
    else:
        found = node.sessions.peek(wanted)
        sessions = [found] if found is not None else []
    for session in sessions:
        for key, options in session.subscriptions.items():
            items.append({
                "clientid": session.client_id,
                "node": node.config["node.name"],
                "topic": key,
                "qos": options.qos,
                "nl": int(options.no_local),
                "rap": int(options.retain_as_published),
                "rh": options.retain_handling,
                "share_group": options.share_group,
                "subid": options.identifier,
            })
    return items


class Peers(Protocol):
    """The other nodes of a cluster, as the API asks them (broker/http/cluster_api.py).
    Absent without a cluster: the node then answers for itself."""

    async def gather(self, kind: str, params: Any) -> list[dict[str, Any]]:
        """Every linked peer's items of `kind` (see cluster_api's `items`), concatenated;
        a peer that does not answer is left out."""
        ...

    async def kick(self, client_id: str) -> tuple[list[str], list[str]]:
        """Kicks the client on whichever peers hold it: (the nodes that did, the nodes that
        did not answer)."""
        ...

    def linked(self) -> set[str]:
        """Sites of the peers with a link up now: those that serve their own sessions."""
        ...

    def name_of(self, site: str) -> str:
        """A member's node name (the site itself for one no longer a member)."""
        ...


PEERS_KEY = web.AppKey("peers", Peers)


async def gather(request: web.Request, kind: str, params: Any) -> list[dict[str, Any]]:
    peers = request.app.get(PEERS_KEY)
    return await peers.gather(kind, params) if peers is not None else []


async def everywhere(request: web.Request, kind: str, params: Any,
                      local: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This node's items and every other node's, in one order: any node answers for the
    whole cluster, as EMQX's API does."""
    items = local + await gather(request, kind, params)
    node = request.query.get("node")  # EMQX's filter
    if node is not None:
        items = [item for item in items if item["node"] == node]
    return sorted(items, key=lambda item: (item["clientid"], item.get("topic", "")))
