"""`GET /api/v5/durable_shared_groups`: the durable shared-subscription groups, with their
members (node, connected, the shards each reads) and what each has not read yet.

Any node answers for the cluster with `builtin_raft`: every node's replica of the `sessions`
database holds every group. With `builtin_local` a node lists the groups of its sessions.
The answer is sent in pieces as it is built, in time slices (GroupViews.describe): with
10,000 groups or members, building, encoding or writing it in one go would hold every
client's traffic.
"""

from aiohttp import web

from broker.node import Node

_NONE = b'{"data": [], "meta": {"count": 0}}'


def add_shared_group_routes(app: web.Application, node: Node) -> None:
    async def list_groups(request: web.Request) -> web.StreamResponse:
        views = node.group_views
        if views is None:
            return web.Response(body=_NONE, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        async for piece in views.describe(node.member_node):
            await response.write(piece)
        await response.write_eof()
        return response

    app.router.add_get("/api/v5/durable_shared_groups", list_groups)
