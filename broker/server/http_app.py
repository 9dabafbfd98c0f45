"""The node's HTTP API and metrics, assembled from its components (imported by
http_listener.py on a worker thread: aiohttp and prometheus_client come with this module)."""

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from aiohttp import web

from broker.cluster import versions
from broker.http.api import make_app
from broker.http.backup_api import add_backup_routes
from broker.http.cluster_api import add_cluster_routes, add_raft_routes
from broker.http.ds_sites_api import add_ds_site_routes
from broker.http.header_timeout import HeaderTimeout
from broker.metrics import add_samples, make_registry

if TYPE_CHECKING:
    from broker.server.app import BrokerApp


async def start(app: "BrokerApp") -> tuple[Callable[[], asyncio.BaseProtocol],
                                           Callable[[], Awaitable[None]]]:
    """The protocol factory of the API's connections, and what stops it."""
    node, config = app.node, app.config
    routing, takeover = node.cluster_routing, node.takeover
    assert routing is not None and takeover is not None  # made with the app
    registry = make_registry(node.stats, node.gauges, node.ds, node.alarms.samples,
                             app.cluster.metrics, routing.metrics, takeover.metrics,
                             node.security.metrics)
    if node.group_views is not None:
        registry.add_rendered(node.group_views.exposition)
    web_app = make_app(node, registry)
    add_cluster_routes(web_app, node, app.cluster, app.rpc)
    if app.metadata is not None:
        add_samples(registry, app.metadata.metrics)
        add_raft_routes(web_app, app.metadata)
    if app.ds_groups is not None:
        add_ds_site_routes(web_app, app.ds_groups)
        add_samples(registry, app.ds_groups.metrics)
    # A kept-alive connection's next request has as long as a new one's first, and an
    # import's upload as long between two bytes.
    header_timeout = config["dashboard.listeners.http.header_timeout"]
    keeper = app.versions
    add_backup_routes(web_app, app.ds_groups, (lambda: None) if keeper is None else
                      lambda: versions.load_refusal(keeper.effective()), header_timeout)
    runner = web.AppRunner(web_app, access_log=None, keepalive_timeout=header_timeout)
    await runner.setup()
    assert runner.server is not None
    handlers = HeaderTimeout.factory(runner.server, header_timeout,
                                     partial(node.stats.time_out, "http_headers"))
    return handlers, runner.cleanup
