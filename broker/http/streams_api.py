"""Named streams over HTTP (`/api/v5/message_streams`, after EMQX 6.1's MQTT Streams API).

A stream is a key of the `sessions` database (streams.py): with `builtin_raft` any node
creates or deletes it for the whole cluster (the answer comes once a majority has it) and
any node lists every stream; with `builtin_local` each node's streams are its own.
Creating a stream that exists with the same filter answers it again (200); with another
filter, 409.
"""

import json
from typing import Any

from aiohttp import web

from broker.http.common import NODE_KEY, page
from broker.session.durable.streams import StreamError, Streams

_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest, 404: web.HTTPNotFound, 409: web.HTTPConflict}


def _error(status: int, code: str, message: str) -> web.HTTPException:
    text = json.dumps({"code": code, "message": message})
    return _ERRORS[status](text=text, content_type="application/json")


def _streams(request: web.Request) -> Streams:
    streams = request.app[NODE_KEY].streams
    if streams is None:
        raise _error(404, "NOT_FOUND", "durable storage is disabled")
    return streams


async def list_streams(request: web.Request) -> web.Response:
    return page(request, [stream.view() for stream in _streams(request).all()])


async def get_stream(request: web.Request) -> web.Response:
    stream = _streams(request).get(request.match_info["name"])
    if stream is None:
        raise _error(404, "NOT_FOUND", "no such stream")
    return web.json_response(stream.view())


async def create_stream(request: web.Request) -> web.Response:
    streams = _streams(request)
    try:
        body: Any = await request.json()
    except ValueError:
        raise _error(400, "BAD_REQUEST", "the body is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("name"), str) \
            or not isinstance(body.get("topic_filter"), str):
        raise _error(400, "BAD_REQUEST", 'expected {"name": ..., "topic_filter": ...}')
    existed = streams.get(body["name"]) is not None
    try:
        stream, written = streams.create(body["name"], body["topic_filter"])
    except StreamError as error:
        raise _error(409 if error.conflict else 400,
                     "CONFLICT" if error.conflict else "BAD_REQUEST", str(error)) from None
    await written
    return web.json_response(stream.view(), status=200 if existed else 201)


async def delete_stream(request: web.Request) -> web.Response:
    written = _streams(request).delete(request.match_info["name"])
    if written is None:
        raise _error(404, "NOT_FOUND", "no such stream")
    await written
    return web.Response(status=204)


def add_stream_routes(app: web.Application) -> None:
    app.router.add_get("/api/v5/message_streams", list_streams)
    app.router.add_post("/api/v5/message_streams", create_stream)
    app.router.add_get("/api/v5/message_streams/{name}", get_stream)
    app.router.add_delete("/api/v5/message_streams/{name}", delete_stream)
