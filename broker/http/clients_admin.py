"""Acting on one client, wherever in the cluster it is (EMQX's API shape).

`DELETE /api/v5/clients/{clientid}` is EMQX's kick: the connection is closed (a v5 client is
told Administrative action, 0x98) and the session discarded, durable or not, so an offline
durable session can be cleared this way too. A client held by another node is kicked there:
the request goes to every linked peer over the cluster's RPC (one round trip; during a
takeover two nodes may hold one ID for a moment, and both let it go). One that no node
holds gets a 404 that says it is gone; a durable session whose node is down (only its
replica is left) a 409 that says what will become of it.
"""

from aiohttp import web

from broker.http.common import NODE_KEY, PEERS_KEY, gather, local_subscriptions
from broker.http.unserved import unserved
from broker.mqtt.constants import ReasonCode
from broker.node import Node


def _not_found(message: str) -> web.Response:
    return web.json_response({"code": "CLIENTID_NOT_FOUND", "message": message}, status=404)


def kick_here(node: Node, client_id: str) -> bool:
    """Kicks the client if this node holds it; also what a peer's `kick` call runs."""
    session = node.sessions.get(client_id)
    if session is None:
        return False
    connection = session.connection
    if connection is not None:
        connection.take_over(ReasonCode.ADMINISTRATIVE_ACTION)  # detaches the session now
    node.sessions.end(session)
    return True


def _owner_down(request: web.Request, client_id: str) -> str | None:
    """The node name of a down node whose durable session `client_id` is, if one is."""
    node, peers = request.app[NODE_KEY], request.app.get(PEERS_KEY)
    if node.ds is None or peers is None:
        return None
    served = peers.linked() | {node.ds.site_id}
    for session in unserved(node.ds.sessions, served):
        if session.client_id == client_id:
            return peers.name_of(session.site)
    return None


async def kick(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    client_id = request.match_info["clientid"]
    if kick_here(node, client_id):
        return web.Response(status=204)
    peers = request.app.get(PEERS_KEY)
    kicked, silent = await peers.kick(client_id) if peers is not None else ([], [])
    if kicked:
        return web.Response(status=204)
    owner = _owner_down(request, client_id)
    if owner is not None:
        if node.replicated_ds and await node.sessions.discard_stored(client_id):
            return web.Response(status=204)  # taken from the down node and ended
        return web.json_response({
            "code": "NODE_DOWN",
            "message": f"client {client_id!r} has a durable session on node {owner}, which is"
                       " down, and this node could not take it over to end it (no majority"
                       " reachable, or its client came back on another node)",
        }, status=409)
    unanswered = f" ({', '.join(silent)} did not answer)" if silent else ""
    return _not_found(f"client {client_id!r} is already gone: not connected and no session"
                      f" kept{unanswered}")


async def client_subscriptions(request: web.Request) -> web.Response:
    """EMQX answers this one with a plain list, not a page."""
    node = request.app[NODE_KEY]
    client_id = request.match_info["clientid"]
    if node.sessions.peek(client_id) is not None:
        return web.json_response(local_subscriptions(node, client_id))
    found = await gather(request, "subscriptions", client_id)
    if not found and not await gather(request, "client", client_id):
        return _not_found(f"client {client_id!r} not found")
    return web.json_response(found)


def add_client_admin_routes(app: web.Application) -> None:
    app.router.add_delete("/api/v5/clients/{clientid}", kick)
    app.router.add_get("/api/v5/clients/{clientid}/subscriptions", client_subscriptions)
