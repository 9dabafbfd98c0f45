"""The HTTP API on `dashboard.listeners.http.bind`: EMQX-shaped `/api/v5/...` and /metrics.

Handlers read through `Node`'s public state only; responses use EMQX's field names and
paging envelope (`data` + `meta`) so existing dashboards and scripts mostly just work.
Who may call what is decided before any handler runs (broker/http/auth.py).
"""

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from broker.ds import DurableStorage
from broker.http.alarms_api import add_alarm_routes
from broker.http.auth import install as install_auth
from broker.http.authn_users_api import add_authn_user_routes
from broker.http.clients_admin import add_client_admin_routes
from broker.http.common import (
    NODE_KEY,
    client_view,
    everywhere,
    gather,
    local_clients,
    local_subscriptions,
    page,
)
from broker.http.dashboard import add_dashboard_routes
from broker.http.dashboard.login import Logins
from broker.http.durable_sessions_api import add_durable_session_routes
from broker.http.monitor_api import add_monitor_routes
from broker.http.retainer_api import add_retainer_routes
from broker.http.shared_groups_api import add_shared_group_routes
from broker.http.streams_api import add_stream_routes
from broker.metrics import Registry, add_samples
from broker.node import Node

REGISTRY_KEY = web.AppKey("registry", Registry)


async def list_clients(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    return page(request, await everywhere(request, "clients", None, local_clients(node)))


async def get_client(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    wanted = request.match_info["clientid"]
    session = node.sessions.peek(wanted)
    if session is not None:
        return web.json_response(client_view(node, session))
    found = await gather(request, "client", wanted)
    if not found:
        return web.json_response(
            {"code": "CLIENTID_NOT_FOUND", "message": "Client ID not found"}, status=404
        )
    # Two nodes can hold one ID for a moment (a takeover under way): the connected one.
    return web.json_response(max(found, key=lambda item: item["connected"]))


async def list_subscriptions(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    wanted = request.query.get("clientid")  # EMQX's filter
    return page(request, await everywhere(request, "subscriptions", wanted,
                                            local_subscriptions(node, wanted)))


async def status(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    return web.json_response({"node": node.config["node.name"], "status": "running"})


async def ready(request: web.Request) -> web.Response:
    """The readiness probe: 503 until the node has tried to join every peer discovery named
    (a single node, or `manual` discovery, is ready at once)."""
    node = request.app[NODE_KEY]
    cluster = node.cluster_routing.cluster if node.cluster_routing is not None else None
    joined = node.joined
    body = {"node": node.config["node.name"], "joined": joined,
            "peers": len(cluster.links) if cluster is not None else 0}
    return web.json_response(body, status=200 if joined else 503)


def _ds_or_404(request: web.Request) -> DurableStorage:
    ds = request.app[NODE_KEY].ds
    if ds is None:
        raise web.HTTPNotFound(
            text='{"code": "NOT_FOUND", "message": "durable storage is disabled"}',
            content_type="application/json",
        )
    return ds


async def ds_storages(request: web.Request) -> web.Response:
    """Like `emqx ctl ds info`: site, and per database its shards and generations."""
    return web.json_response(_ds_or_404(request).info())


async def ds_seal(request: web.Request) -> web.Response:
    """Seals the current generation of every shard that has data (for offline readers)."""
    ds = _ds_or_404(request)
    if request.match_info["db"] != "messages":
        return web.json_response(
            {"code": "BAD_REQUEST", "message": "only the messages database has generations"},
            status=400,
        )
    sealed = await ds.seal()
    return web.json_response({"sealed": sealed, **ds.messages.info()})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[REGISTRY_KEY].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(node: Node, registry: Registry) -> web.Application:
    app = web.Application()
    app[NODE_KEY] = node
    app[REGISTRY_KEY] = registry
    logins = Logins(node.config)
    add_samples(registry, logins.metrics)
    # Also guards the routes added after this.
    logins.keys = install_auth(app, node.config, registry, logins)
    app.router.add_get("/status", status)
    app.router.add_get("/api/v5/status", status)
    app.router.add_get("/api/v5/ready", ready)
    app.router.add_get("/api/v5/clients", list_clients)
    app.router.add_get("/api/v5/clients/{clientid}", get_client)
    app.router.add_get("/api/v5/subscriptions", list_subscriptions)
    app.router.add_get("/api/v5/ds/storages", ds_storages)
    app.router.add_post("/api/v5/ds/storages/{db}/generations", ds_seal)
    app.router.add_get("/metrics", metrics)
    add_alarm_routes(app)
    app.router.add_get("/api/v5/prometheus/stats", metrics)
    add_dashboard_routes(app, logins)
    add_client_admin_routes(app)
    add_durable_session_routes(app)
    add_retainer_routes(app)
    add_authn_user_routes(app)
    add_monitor_routes(app)
    add_shared_group_routes(app, node)
    add_stream_routes(app)
    return app
