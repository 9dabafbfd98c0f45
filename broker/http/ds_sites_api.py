"""`GET /api/v5/ds/sites` and `GET /api/v5/ds/sites/{site}` (EMQX's paths and shape): which
Durable Storage shards each site holds, for the operator's drain-before-shrink and
`broker ctl ds info`. Served with `durable_storage.messages.backend = builtin_raft` only: with
node-local storage a site's shards cannot move, so a 404 tells the operator it will not get
a drain confirmation."""

from aiohttp import web

from broker.cluster.ds_groups import DsGroups

GROUPS_KEY = web.AppKey("ds_groups", DsGroups)


async def list_sites(request: web.Request) -> web.Response:
    return web.json_response(request.app[GROUPS_KEY].sites())


async def get_site(request: web.Request) -> web.Response:
    site = await request.app[GROUPS_KEY].site(request.match_info["site"])
    if site is None:
        return web.json_response({"code": "NOT_FOUND", "message": "no such site"},
                                 status=404)
    return web.json_response(site)


def add_ds_site_routes(app: web.Application, groups: DsGroups) -> None:
    app[GROUPS_KEY] = groups
    app.router.add_get("/api/v5/ds/sites", list_sites)
    app.router.add_get("/api/v5/ds/sites/{site}", get_site)
