"""Durable Storage's sites and replicas over HTTP, in EMQX's paths and shapes
(`/api/v5/ds/...`), for the operator's drain-before-shrink and `broker ctl ds`:

- `GET /ds/sites`, `GET /ds/sites/{site}`: which shards each site holds;
- `GET|PUT /ds/storages/messages/replicas`, `PUT|DELETE .../replicas/{site}`: the sites
  that may vote in the `messages` shards (ds_replicas.py): list, set, join, leave;
- `DELETE /ds/sites/{site}`: forget a site that is gone for good.

Served with `durable_storage.messages.backend = builtin_raft` only: with node-local storage a
site's shards cannot move, so a 404 tells the operator it will not get a drain confirmation.
"""

from collections.abc import Callable

from aiohttp import web

from broker.cluster import ds_replicas
from broker.cluster.ds_groups import DsGroups
from broker.cluster.proposer import CommitTimeout

GROUPS_KEY = web.AppKey("ds_groups", DsGroups)
REPLICAS = f"/api/v5/ds/storages/{ds_replicas.DB}/replicas"


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"code": code, "message": message}, status=status)


async def list_sites(request: web.Request) -> web.Response:
    return web.json_response(request.app[GROUPS_KEY].sites())


async def get_site(request: web.Request) -> web.Response:
    site = await request.app[GROUPS_KEY].site(request.match_info["site"])
    if site is None:
        return _error(404, "NOT_FOUND", "no such site")
    return web.json_response(site)


async def forget_site(request: web.Request) -> web.Response:
    try:
        site = request.app[GROUPS_KEY].forget(request.match_info["site"])
    except ds_replicas.ReplicasRefused as refused:
        return _error(400, "BAD_REQUEST", str(refused))
    return web.json_response({"forgotten": site})


async def list_replicas(request: web.Request) -> web.Response:
    return web.json_response(request.app[GROUPS_KEY].replicas())


async def _change(request: web.Request,
                  change: Callable[[frozenset[str] | None, set[str]], frozenset[str]]
                  ) -> web.Response:
    try:
        return web.json_response(await request.app[GROUPS_KEY].change_replicas(change))
    except ds_replicas.ReplicasRefused as refused:
        return _error(400, "BAD_REQUEST", str(refused))
    except CommitTimeout as timeout:
        return _error(503, "SERVICE_UNAVAILABLE", str(timeout))


async def set_replicas(request: web.Request) -> web.Response:
    try:
        sites = await request.json()
    except ValueError:
        sites = None
    if not isinstance(sites, list) or not all(isinstance(site, str) for site in sites):
        return _error(400, "BAD_REQUEST", "the body must be a JSON list of site IDs")
    return await _change(request, lambda _current, members: ds_replicas.set_replicas(
        sites, members))


async def join_replica(request: web.Request) -> web.Response:
    site = request.match_info["site"]
    return await _change(request, lambda current, members: ds_replicas.join(
        current, site, members))


async def leave_replica(request: web.Request) -> web.Response:
    site = request.match_info["site"]
    return await _change(request, lambda current, members: ds_replicas.leave(
        current, site, members))


def add_ds_site_routes(app: web.Application, groups: DsGroups) -> None:
    app[GROUPS_KEY] = groups
    app.router.add_get("/api/v5/ds/sites", list_sites)
    app.router.add_get("/api/v5/ds/sites/{site}", get_site)
    app.router.add_delete("/api/v5/ds/sites/{site}", forget_site)
    app.router.add_get(REPLICAS, list_replicas)
    app.router.add_put(REPLICAS, set_replicas)
    app.router.add_put(REPLICAS + "/{site}", join_replica)
    app.router.add_delete(REPLICAS + "/{site}", leave_replica)
