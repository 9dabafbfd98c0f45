"""Retained messages over HTTP, in EMQX's shape (`/api/v5/mqtt/retainer/...`).

Every node holds every retained message (the retainer is replicated by the metadata Raft
group in a cluster), so one node answers for all, and a delete goes the way a PUBLISH with
an empty retained payload goes (through the Raft log when there is one) without being
delivered to anyone: clearing a topic from the dashboard must not wake its subscribers.
A topic in a path is percent-encoded (`a%2Fb`); `{topic:.+}` also takes it with raw slashes.
"""

import base64
from typing import Any, Final

from aiohttp import web

from broker.http.common import NODE_KEY, page
from broker.mqtt.constants import PropertyId
from broker.retainer.store import RetainedStore
from broker.session.message import Message

DASHBOARD_PUBLISHER: Final = "$dashboard"


def _retainer(request: web.Request) -> RetainedStore:
    retainer = request.app[NODE_KEY].retainer
    if retainer is None:
        raise web.HTTPNotFound(
            text='{"code": "NOT_FOUND", "message": "the retainer is disabled"}',
            content_type="application/json")
    return retainer


def _summary(message: Message) -> dict[str, Any]:
    return {
        "topic": message.topic,
        "qos": message.qos,
        "from_clientid": message.publisher,
        "payload_size": len(message.payload),
        "expires_at": message.expires_at,
    }


def _found(request: web.Request) -> Message:
    topic = request.match_info["topic"]
    # A topic name is its own exact filter; one with a wildcard is no topic name.
    found = [] if "+" in topic or "#" in topic else _retainer(request).match(topic)
    if found:
        return found[0]
    raise web.HTTPNotFound(
        text='{"code": "NOT_FOUND", "message": "no retained message on this topic"}',
        content_type="application/json")


async def list_messages(request: web.Request) -> web.Response:
    """`?topic=FILTER` (EMQX's parameter); without it every topic, `$SYS` ones included."""
    retainer = _retainer(request)
    wanted = request.query.get("topic")
    messages = retainer.match(wanted) if wanted else (
        retainer.match("#") + retainer.match("$SYS/#"))
    return page(request, [_summary(m) for m in sorted(messages, key=lambda m: m.topic)])


async def get_message(request: web.Request) -> web.Response:
    """The payload in base64 (EMQX's encoding: it may be any bytes), user properties as
    [name, value] pairs."""
    message = _found(request)
    user_properties = message.properties.get(PropertyId.USER_PROPERTY, [])
    return web.json_response({
        **_summary(message),
        "payload": base64.b64encode(message.payload).decode(),
        "user_properties": [list(pair) for pair in user_properties],
    })


async def delete_message(request: web.Request) -> web.Response:
    message = _found(request)
    node = request.app[NODE_KEY]
    empty = Message(message.topic, b"", 0, True, DASHBOARD_PUBLISHER)
    if node.retained_writer is not None:
        await node.retained_writer(empty)
    else:
        _retainer(request).put(empty)
    return web.Response(status=204)


def add_retainer_routes(app: web.Application) -> None:
    app.router.add_get("/api/v5/mqtt/retainer/messages", list_messages)
    app.router.add_get("/api/v5/mqtt/retainer/message/{topic:.+}", get_message)
    app.router.add_delete("/api/v5/mqtt/retainer/message/{topic:.+}", delete_message)
