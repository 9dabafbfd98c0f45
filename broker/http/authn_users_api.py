"""SCRAM users over HTTP, in EMQX's shape: `/api/v5/authentication/scram:built_in_database/
users[/{user_id}]` (the ID may be percent-encoded, `scram%3Abuilt_in_database`).

    GET     users              {data: [{user_id, is_superuser}], meta}
    POST    users              {user_id, password, is_superuser?} -> 201
    GET     users/{user_id}    {user_id, is_superuser}
    PUT     users/{user_id}    {password?, is_superuser?}
    DELETE  users/{user_id}    204

This node's `authentication.scram.user_file` is written (atomically) and in force at once;
a cluster shares users by sharing the file (a Kubernetes Secret), not through this API.
The PBKDF2 of a new password runs on a worker thread, never on the event loop.
"""

import asyncio
import json
from typing import Any, Final

from aiohttp import web

from broker.auth.scram_users import ScramFileError, ScramUser, make_user
from broker.auth.security import Security
from broker.http.common import NODE_KEY, page

AUTHENTICATOR: Final = "scram:built_in_database"
_BASE: Final = "/api/v5/authentication/{authenticator}/users"


def _error(status: type[web.HTTPError], code: str, message: str) -> web.HTTPError:
    return status(text=json.dumps({"code": code, "message": message}),
                  content_type="application/json")


def _security(request: web.Request) -> tuple[Security, dict[str, ScramUser]]:
    if request.match_info["authenticator"] != AUTHENTICATOR:
        raise _error(web.HTTPNotFound, "NOT_FOUND",
                     f"no authenticator {request.match_info['authenticator']!r} (this broker"
                     f" manages {AUTHENTICATOR!r})")
    security = request.app[NODE_KEY].security
    if security.scram_users is None:
        raise _error(web.HTTPNotFound, "NOT_FOUND",
                     "SCRAM is off: set authentication.scram.user_file")
    return security, security.scram_users


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise _error(web.HTTPBadRequest, "BAD_REQUEST", "the body must be a JSON object")
    superuser = body.get("is_superuser", False)
    password = body.get("password")
    if not isinstance(superuser, bool) or (password is not None and (
            not isinstance(password, str) or not password)):
        raise _error(web.HTTPBadRequest, "BAD_REQUEST",
                     "password must be a non-empty string, is_superuser a boolean")
    return body


async def _made(security: Security, user_id: str, password: str,
                superuser: bool) -> ScramUser:
    try:
        return await asyncio.to_thread(make_user, user_id, password.encode(), superuser,
                                       security.scram_iterations)
    except ScramFileError as error:
        raise _error(web.HTTPBadRequest, "BAD_REQUEST", str(error)) from None


def _saved(security: Security, users: dict[str, ScramUser]) -> None:
    try:
        security.save_scram_users(users)
    except OSError as error:
        raise _error(web.HTTPInternalServerError, "INTERNAL_ERROR",
                     f"writing the user file failed: {error}") from None


async def list_users(request: web.Request) -> web.Response:
    _, users = _security(request)
    return page(request, [user.summary() for user in users.values()])


async def add_user(request: web.Request) -> web.Response:
    security, _ = _security(request)
    body = await _body(request)
    user_id, password = body.get("user_id"), body.get("password")
    if not isinstance(user_id, str) or password is None:
        raise _error(web.HTTPBadRequest, "BAD_REQUEST", "user_id and password are required")
    if user_id in (security.scram_users or {}):
        raise _error(web.HTTPConflict, "ALREADY_EXISTS", f"user {user_id!r} exists")
    user = await _made(security, user_id, password, body.get("is_superuser", False))
    users = dict(security.scram_users or {})  # as it is now, after the thread's work
    if user_id in users:
        raise _error(web.HTTPConflict, "ALREADY_EXISTS", f"user {user_id!r} exists")
    users[user_id] = user
    _saved(security, users)
    return web.json_response(user.summary(), status=201)


def _known(request: web.Request) -> tuple[Security, ScramUser]:
    security, users = _security(request)
    user = users.get(request.match_info["user_id"])
    if user is None:
        raise _error(web.HTTPNotFound, "NOT_FOUND",
                     f"no user {request.match_info['user_id']!r}")
    return security, user


async def get_user(request: web.Request) -> web.Response:
    return web.json_response(_known(request)[1].summary())


async def update_user(request: web.Request) -> web.Response:
    security, user = _known(request)
    body = await _body(request)
    superuser = body.get("is_superuser", user.is_superuser)
    if body.get("password") is not None:
        user = await _made(security, user.user_id, body["password"], superuser)
    else:
        user = ScramUser(user.user_id, superuser, user.credentials)
    users = dict(security.scram_users or {})
    users[user.user_id] = user
    _saved(security, users)
    return web.json_response(user.summary())


async def delete_user(request: web.Request) -> web.Response:
    security, user = _known(request)
    users = dict(security.scram_users or {})
    del users[user.user_id]
    _saved(security, users)
    return web.Response(status=204)


def add_authn_user_routes(app: web.Application) -> None:
    app.router.add_get(_BASE, list_users)
    app.router.add_post(_BASE, add_user)
    app.router.add_get(_BASE + "/{user_id}", get_user)
    app.router.add_put(_BASE + "/{user_id}", update_user)
    app.router.add_delete(_BASE + "/{user_id}", delete_user)
