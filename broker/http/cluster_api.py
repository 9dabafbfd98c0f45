"""The cluster's HTTP API: `/api/v5/nodes` (EMQX's shape) and `/api/v5/cluster` operations.

Any node answers for the whole cluster: what another node knows (its connections, its
uptime) is asked of it over RPC, and a node that does not answer is listed as `stopped`
with what membership knows of it, never left out.
"""

import logging
import time
from typing import Any

from aiohttp import web

from broker.cluster.metadata import MetadataGroup
from broker.cluster.rpc import Rpc
from broker.cluster.service import Cluster
from broker.http.clients_admin import kick_here
from broker.http.common import (
    NODE_KEY,
    PEERS_KEY,
    client_view,
    local_clients,
    local_subscriptions,
)
from broker.http.durable_sessions_api import MISSED_KEY, local_missed, local_views
from broker.node import Node
from broker.version import RELEASE

log = logging.getLogger(__name__)

CLUSTER_KEY = web.AppKey("cluster", Cluster)
RPC_KEY = web.AppKey("rpc", Rpc)
RAFT_KEY = web.AppKey("raft", MetadataGroup)

def local_node_info(node: Node, cluster: Cluster) -> dict[str, Any]:
    """This node's entry of `/api/v5/nodes`, also served to peers over RPC."""
    connected = len(node.connections)
    return {
        "node": cluster.me.node,
        "site": cluster.me.site,
        "node_status": "running",
        "version": RELEASE,
        "uptime": int((time.time() - cluster.started_at) * 1000),
        "connections": len(node.sessions.sessions),
        "live_connections": connected,
        "role": "core",
        "joined": node.joined,
    }


async def _nodes(request: web.Request) -> list[dict[str, Any]]:
    cluster, rpc = request.app[CLUSTER_KEY], request.app[RPC_KEY]
    answers = await rpc.multicall("node_info", timeout=3.0)
    nodes = [local_node_info(request.app[NODE_KEY], cluster)]
    for row in cluster.status()[1:]:
        answer = answers.get(row["site"])
        if isinstance(answer, dict):
            nodes.append(answer)
        else:
            nodes.append({"node": row["node"], "site": row["site"], "node_status": "stopped",
                          "version": None, "uptime": None, "connections": None,
                          "live_connections": None, "role": "core", "joined": False})
    return nodes


async def list_nodes(request: web.Request) -> web.Response:
    return web.json_response(await _nodes(request))


async def get_node(request: web.Request) -> web.Response:
    wanted = request.match_info["node"]
    for entry in await _nodes(request):
        if wanted in (entry["node"], entry["site"]):
            return web.json_response(entry)
    return web.json_response({"code": "NOT_FOUND", "message": f"no node {wanted}"}, status=404)


async def cluster_status(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER_KEY]
    return web.json_response({"name": cluster.name, "self": cluster.me.node,
                              "cluster_version": cluster.cluster_version(),
                              "nodes": cluster.status()})


async def cluster_join(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER_KEY]
    try:
        body = await request.json()
        await cluster.join(str(body["node"]))
    except (ValueError, KeyError, TypeError) as error:
        return web.json_response({"code": "BAD_REQUEST", "message": str(error)}, status=400)
    metadata = request.app.get(RAFT_KEY)
    if metadata is not None:
        await metadata.after_join()  # adopts the cluster's group, discarding its own
    return web.json_response({"name": cluster.name, "nodes": cluster.status()})


async def cluster_leave(request: web.Request) -> web.Response:
    request.app[CLUSTER_KEY].leave()
    metadata = request.app.get(RAFT_KEY)
    if metadata is not None:
        await metadata.after_leave()  # stands alone: its history of the group discarded
    return web.json_response({"left": True})


async def cluster_force_leave(request: web.Request) -> web.Response:
    if not request.app[CLUSTER_KEY].force_leave(request.match_info["node"]):
        return web.json_response(
            {"code": "NOT_FOUND", "message": f"no member {request.match_info['node']}"},
            status=404)
    return web.json_response({"removed": request.match_info["node"]})


def _local_items(app: web.Application, kind: str, params: Any) -> list[dict[str, Any]]:
    """What this node answers to a peer's `items` call."""
    node = app[NODE_KEY]
    if kind == "clients":
        return local_clients(node)
    if kind == "subscriptions":
        return local_subscriptions(node, None if params is None else str(params))
    if kind == "client":
        session = node.sessions.peek(str(params))
        return [client_view(node, session)] if session is not None else []
    if kind == "durable_sessions":
        return local_views(node, app.get(MISSED_KEY), None if params is None else str(params))
    if kind == "missed":
        return local_missed(node, app.get(MISSED_KEY), [str(c) for c in params])
    raise ValueError(f"unknown kind {kind!r}")


class ClusterPeers:
    """The API's `Peers` over the cluster's links and RPC."""

    def __init__(self, cluster: Cluster, rpc: Rpc) -> None:
        self._cluster = cluster
        self._rpc = rpc

    async def gather(self, kind: str, params: Any) -> list[dict[str, Any]]:
        """Items of every linked peer; a peer that fails to answer is left out and logged
        (its clients are listed again once it answers), never fails the whole request."""
        items: list[dict[str, Any]] = []
        answers = await self._rpc.multicall("items", [kind, params], timeout=5.0)
        for site, answer in answers.items():
            if isinstance(answer, list):
                items.extend(answer)
            else:
                log.warning("listing %s: node %s did not answer: %s", kind, site, answer)
        return items

    async def kick(self, client_id: str) -> tuple[list[str], list[str]]:
        answers = await self._rpc.multicall("kick", client_id, timeout=5.0)
        kicked = [self.name_of(site) for site, answer in answers.items() if answer is True]
        silent = [self.name_of(site) for site, answer in answers.items()
                  if not isinstance(answer, bool)]
        return kicked, silent

    def linked(self) -> set[str]:
        return set(self._cluster.peers())

    def name_of(self, site: str) -> str:
        member = self._cluster.membership.members.get(site)
        return member.identity.node if member is not None else site


def add_cluster_routes(app: web.Application, node: Node, cluster: Cluster, rpc: Rpc) -> None:
    app[CLUSTER_KEY] = cluster
    app[RPC_KEY] = rpc
    rpc.register("node_info", lambda _params: local_node_info(node, cluster))
    rpc.register("items", lambda params: _local_items(app, str(params[0]), params[1]))
    rpc.register("kick", lambda client_id: kick_here(node, str(client_id)))
    app[PEERS_KEY] = ClusterPeers(cluster, rpc)
    app.router.add_get("/api/v5/nodes", list_nodes)
    app.router.add_get("/api/v5/nodes/{node}", get_node)
    app.router.add_get("/api/v5/cluster", cluster_status)
    app.router.add_post("/api/v5/cluster/join", cluster_join)
    app.router.add_post("/api/v5/cluster/leave", cluster_leave)
    app.router.add_delete("/api/v5/cluster/{node}/force_leave", cluster_force_leave)


async def raft_status(request: web.Request) -> web.Response:
    return web.json_response(request.app[RAFT_KEY].status())


def add_raft_routes(app: web.Application, metadata: MetadataGroup) -> None:
    """`GET /api/v5/raft`: this node's Raft groups as it sees them (role, leader, term,
    commit and applied indexes, voters and learners)."""
    app[RAFT_KEY] = metadata
    app.router.add_get("/api/v5/raft", raft_status)

