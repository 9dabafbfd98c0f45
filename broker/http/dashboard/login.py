"""Who may use the web dashboard: a login exchanged for a token that expires.

The browser cannot keep an API key safer than a token: a token can be logged out and
expires by itself (`dashboard.token_expired_time`), so a forgotten tab does not stay an
administrator forever. Logins are `dashboard.default_username`/`default_password` (an
administrator) or an API key's name and secret (that key's role, so a viewer key gives a
read-only dashboard). Tokens live in memory: a restart logs everyone out, which is fine
for a few people watching a broker and keeps secrets off the disk.

The default password (EMQX's `public`) is refused off loopback: a broker whose HTTP
listener binds anything but loopback (the default 0.0.0.0, a Kubernetes pod) answers every
user-name login with 403 until another password is set, so a dashboard reachable from the
network never opens with a password everyone knows. On loopback only local processes
reach it, as the open API there (broker/http/auth.py). Refusing is simpler to reason about
than forcing a change at first login, which would have to store the new password and
would hand the broker to whoever logs in first.

Repeated failures from one address are throttled (throttle.py): 429 with Retry-After.
"""

import hmac
import logging
import math
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aiohttp import web

from broker.auth.security import SecurityFileError
from broker.config.loader import Config
from broker.http.auth import ADMINISTRATOR, ApiKeys, bearer_token, loopback
from broker.http.dashboard.throttle import LoginThrottle
from broker.stats import Sample

log = logging.getLogger(__name__)

DEFAULT_PASSWORD: Final = "public"
MAX_TOKENS: Final = 1000  # live logins kept; past it the oldest is logged out
PUBLIC_PATHS: Final = frozenset({"/", "/api/v5/login"})
ASSET_PREFIX: Final = "/dashboard/"


class PasswordFileError(SecurityFileError):
    """`dashboard.default_password_file` cannot be used: `broker run` reports it and does
    not start, like the other security files."""


@dataclass(frozen=True, slots=True)
class Login:
    username: str
    role: str
    expires_at: float  # time.monotonic()


def _password(config: Config) -> str:
    path: str = config["dashboard.default_password_file"]
    if not path:
        return str(config["dashboard.default_password"])
    try:
        password = Path(path).read_text().strip()
    except OSError as error:
        raise PasswordFileError(
            f"dashboard.default_password_file {path}: {error.strerror}") from None
    if not password:
        raise PasswordFileError(f"dashboard.default_password_file {path}: the file is empty")
    return password


class Logins:
    """The dashboard's live tokens; also the `Logins` that broker/http/auth.py asks."""

    def __init__(self, config: Config) -> None:
        self.username: str = config["dashboard.default_username"]
        self._password = _password(config)
        self.ttl: float = config["dashboard.token_expired_time"]
        self.keys: ApiKeys | None = None  # set once auth.install has loaded them
        self._tokens: dict[str, Login] = {}
        self.attempts: dict[str, int] = {}  # login attempts by result, for /metrics
        self.throttle = LoginThrottle(config["dashboard.unsuccessful_login_max_attempts"],
                                      config["dashboard.unsuccessful_login_interval"],
                                      config["dashboard.unsuccessful_login_lock_duration"])
        host = config["dashboard.listeners.http.bind"]
        self.password_refused = (self._password == DEFAULT_PASSWORD
                                 and host is not None and not loopback(host[0]))
        if self.password_refused:
            log.error("dashboard: the default password is refused on %s (not loopback): set"
                      " dashboard.default_password or dashboard.default_password_file", host[0])

    def public(self, path: str) -> bool:
        return path in PUBLIC_PATHS or path.startswith(ASSET_PREFIX)

    def role(self, token: str) -> str | None:
        login = self._tokens.get(token)
        if login is None:
            return None
        if login.expires_at <= time.monotonic():
            del self._tokens[token]
            return None
        return login.role

    def key_role(self, username: str, password: str) -> str | None:
        return self.keys.role(username, password) if self.keys is not None else None

    def user_role(self, username: str, password: str) -> str | None:
        """Both halves compared in constant time, so a wrong one of either answers alike."""
        name_ok = hmac.compare_digest(username.encode(), self.username.encode())
        password_ok = hmac.compare_digest(password.encode(), self._password.encode())
        return ADMINISTRATOR if name_ok and password_ok else None

    def issue(self, username: str, role: str) -> str:
        now = time.monotonic()
        for token in [t for t, login in self._tokens.items() if login.expires_at <= now]:
            del self._tokens[token]
        while len(self._tokens) >= MAX_TOKENS:
            del self._tokens[next(iter(self._tokens))]  # dicts keep insertion order
        token = secrets.token_urlsafe(32)
        self._tokens[token] = Login(username, role, now + self.ttl)
        return token

    def revoke(self, token: str) -> bool:
        return self._tokens.pop(token, None) is not None

    def attempted(self, result: str) -> None:
        self.attempts[result] = self.attempts.get(result, 0) + 1

    def metrics(self) -> list[Sample]:
        return [("mqtt_dashboard_logins_total", "counter",
                 "Dashboard login attempts: accepted (ok), wrong credentials (rejected), the"
                 " default password off loopback (disabled), or from an address locked out"
                 " after repeated failures (locked)", {"result": result}, float(count))
                for result, count in self.attempts.items()]


LOGINS_KEY: Final = web.AppKey("logins", Logins)
_FAILED: Final = {"code": "BAD_USERNAME_OR_PWD", "message": "Auth failed"}


async def login(request: web.Request) -> web.Response:
    """EMQX's `POST /api/v5/login`: {username, password} -> {token, role, ...}."""
    logins = request.app[LOGINS_KEY]
    try:
        body = await request.json()
        username, password = body["username"], body["password"]
        if not isinstance(username, str) or not isinstance(password, str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return web.json_response(
            {"code": "BAD_REQUEST", "message": "expected JSON {username, password}"}, status=400)
    address, now = request.remote or "", time.monotonic()
    locked_for = logins.throttle.locked_for(address, now)
    if locked_for is not None:
        logins.attempted("locked")
        seconds = math.ceil(locked_for)
        return web.json_response({
            "code": "LOGIN_LOCKED",
            "message": f"too many failed logins from this address: try again in {seconds} s",
        }, status=429, headers={"Retry-After": str(seconds)})
    role = logins.key_role(username, password)
    if role is None and logins.password_refused:
        logins.attempted("disabled")
        logins.throttle.failed(address, now)  # a wrong API key, maybe: a guess like any other
        return web.json_response({
            "code": "LOGIN_DISABLED",
            "message": "the default dashboard password is refused off loopback: set"
                       " dashboard.default_password (or _file) to log in",
        }, status=403)
    role = role or logins.user_role(username, password)
    if role is None:
        logins.attempted("rejected")
        logins.throttle.failed(address, now)
        return web.json_response(_FAILED, status=401)
    logins.attempted("ok")
    logins.throttle.succeeded(address)
    log.info("dashboard: %s logged in (%s)", username, role)
    return web.json_response({
        "token": logins.issue(username, role), "role": role, "username": username,
        "expires_in": int(logins.ttl),
    })


async def logout(request: web.Request) -> web.Response:
    """EMQX's `POST /api/v5/logout`: the token stops working at once."""
    token = bearer_token(request)
    if token is None or not request.app[LOGINS_KEY].revoke(token):
        return web.json_response(
            {"code": "TOKEN_TIME_OUT", "message": "not logged in (or already logged out)"},
            status=401)
    return web.Response(status=204)


async def me(request: web.Request) -> web.Response:
    """Who the token is, for the page to show (and hide what a viewer may not do)."""
    token = bearer_token(request)
    role = request.app[LOGINS_KEY].role(token) if token is not None else None
    if role is None:
        return web.json_response(
            {"code": "TOKEN_TIME_OUT", "message": "not logged in"}, status=401)
    return web.json_response({"role": role})
