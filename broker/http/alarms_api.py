"""`GET /api/v5/alarms`: this node's alarms in EMQX's shape (broker/alarms.py).

`?activated=true` lists the active ones, `?activated=false` those cleared (the newest
first, as many as the node keeps), neither: both. Paged like EMQX's other lists.
"""

from aiohttp import web

from broker.http.common import NODE_KEY, page


async def list_alarms(request: web.Request) -> web.Response:
    raw = request.query.get("activated")
    if raw not in (None, "true", "false"):
        return web.json_response(
            {"code": "BAD_REQUEST", "message": f"activated must be true or false, not {raw!r}"},
            status=400)
    activated = None if raw is None else raw == "true"
    alarms = request.app[NODE_KEY].alarms.listed(activated)
    return page(request, [alarm.to_json() for alarm in alarms])


def add_alarm_routes(app: web.Application) -> None:
    app.router.add_get("/api/v5/alarms", list_alarms)
