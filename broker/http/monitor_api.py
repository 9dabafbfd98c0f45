"""What the dashboard's overview polls: this node's counts and counters, and its listeners.

`GET /api/v5/monitor_current` carries EMQX's gauge names (`connections`, `live_connections`,
`subscriptions`, `retained_msg_count`, ...) and the cumulative `received`, `sent` and
`dropped` message counters of EMQX's `/api/v5/monitor` samples, with the drops by reason
and the broker's clock: the page takes per-second rates from two polls, so the broker
keeps no history for it. `GET /api/v5/listeners` tells the WebSocket client page where
the MQTT-over-WebSocket listener is.
"""

import time
from typing import Any

from aiohttp import web

from broker.http.common import NODE_KEY


async def monitor_current(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    gauges = {name: value for name, (_, value) in node.gauges().items()}
    stats = node.stats
    return web.json_response({
        "node": node.config["node.name"],
        "time": time.time(),
        "connections": gauges["mqtt_sessions"],
        "live_connections": gauges["mqtt_connections"],
        "subscriptions": gauges["mqtt_subscriptions"],
        "retained_msg_count": gauges["mqtt_retained_messages"],
        "durable_sessions_online": gauges["mqtt_durable_sessions_connected"],
        "durable_sessions_offline": gauges["mqtt_durable_sessions_disconnected"],
        "inflight": gauges["mqtt_inflight"],
        "received": sum(stats.messages_received),
        "sent": sum(stats.messages_sent),
        "dropped": sum(stats.messages_dropped.values()),
        "dropped_by_reason": dict(sorted(stats.messages_dropped.items())),
    })


def _listener(config: Any, kind: str, bind_key: str, extra: dict[str, Any]) -> dict[str, Any]:
    bind = config[bind_key]
    return {"id": f"{kind}:default", "type": kind, "running": bind is not None,
            "bind": f"{bind[0]}:{bind[1]}" if bind is not None else None, **extra}


async def listeners(request: web.Request) -> web.Response:
    """As configured: a port of 0 (tests) reads as 0, the page then asks for the URL."""
    config = request.app[NODE_KEY].config
    return web.json_response([
        _listener(config, "tcp", "listeners.tcp.default.bind", {}),
        _listener(config, "ws", "listeners.ws.default.bind",
                  {"websocket": {"mqtt_path": config["listeners.ws.default.websocket.mqtt_path"]}}),
    ])


def add_monitor_routes(app: web.Application) -> None:
    app.router.add_get("/api/v5/monitor_current", monitor_current)
    app.router.add_get("/api/v5/listeners", listeners)
