"""Who may call the HTTP API: API keys in EMQX's shape, sent as HTTP Basic.

A key is a name and a secret with a role, as in EMQX: `administrator` may do anything,
`viewer` may only read (GET, HEAD), so a key handed to monitoring or to `kubectl mqtt`
cannot seal generations or remove cluster members. 401 means no usable credentials, 403 a
key whose role may not do this.

Where the keys come from:

- `api_key.bootstrap_file`: EMQX's bootstrap file (`KEY:SECRET[:ROLE]` lines), e.g. a
  mounted Kubernetes Secret. It is checked for changes (a stat) whenever a request needs a
  key, so a Secret edited in place takes effect without a restart; a version that fails to
  parse keeps the keys in force. At start-up a bad file stops the broker.
- No file, HTTP bound to loopback only: the API stays open, with a warning at start. Only
  local processes reach it (Mosquitto 2's local-only mode, Redis's protected mode), and the
  test suite, benchmarks and a developer's cluster on one machine keep working unchanged.
- No file, any other bind (the default, 0.0.0.0): an administrator key is made at first
  start in `<node.data_dir>/api_key` (mode 0600, kept), so no node ever serves its admin API
  to the network unauthenticated, and `make run` is still usable: the key is where its owner
  can read it, never in the log (logs are shipped to places secrets should not go).

Open whatever the keys: `/status`, `/api/v5/status` and `/api/v5/ready`, because kubelet's
probes cannot send credentials and these tell only that the node runs and whether it has
joined; `/metrics` (and `/api/v5/prometheus/stats`) unless `prometheus.enable_basic_auth`.

The web dashboard's logins (broker/http/dashboard/) pass the same check: a token sent as
`Authorization: Bearer TOKEN` carries its login's role, so a viewer key logged in to the
dashboard can read but not kick; an expired or logged-out token is 401. The dashboard's
page, assets and login endpoint are open, its data comes from the endpoints guarded here.

Kubernetes' API server removes the `Authorization` header from a request it proxies to a
pod (it was the API server's own credential), so the key is also accepted as
`X-Api-Key: KEY:SECRET`: that is how `kubectl mqtt` reaches a broker through the pod proxy.
"""

import base64
import binascii
import hmac
import ipaddress
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client.registry import CollectorRegistry

from broker.auth.security import SecurityFileError, _signature
from broker.config.loader import Config
from broker.ds.files import fsync_dir
from broker.metrics import add_samples
from broker.stats import Sample

log = logging.getLogger(__name__)

ADMINISTRATOR: Final = "administrator"
VIEWER: Final = "viewer"
GENERATED_FILE: Final = "api_key"
KEY_HEADER: Final = "X-Api-Key"
OPEN_PATHS: Final = frozenset({"/status", "/api/v5/status", "/api/v5/ready"})
METRICS_PATHS: Final = frozenset({"/metrics", "/api/v5/prometheus/stats"})
_READ_METHODS: Final = frozenset({"GET", "HEAD"})
_KEY_NAME: Final = re.compile(r"[A-Za-z0-9_-]+")  # EMQX's pattern for a key's name
_CHALLENGE: Final = 'Basic realm="broker", charset="UTF-8"'


class ApiKeyFileError(SecurityFileError):
    """A bootstrap file that cannot be used; `broker run` reports it like the other security
    files and does not start."""


class Logins(Protocol):
    """The dashboard's logins (broker/http/dashboard/login.py), asked here so a token passes
    the same role check as a key."""

    def public(self, path: str) -> bool:
        """The login page and its assets: served to anyone."""
        ...

    def role(self, token: str) -> str | None:
        """The role of a live token; None once expired or logged out."""
        ...


def bearer_token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


@dataclass(frozen=True, slots=True)
class ApiKey:
    secret: bytes
    role: str


def parse_api_keys(text: str, path: str) -> dict[str, ApiKey]:
    """EMQX's bootstrap file: `KEY:SECRET` (an administrator, EMQX's default) or
    `KEY:SECRET:ROLE` per line; blank lines and `#` comments are skipped. A bad line fails
    the whole file, naming file and line but never the secret: half a file would leave keys
    out silently. In file order (`broker ctl --api-key-file` uses the first)."""
    keys: dict[str, ApiKey] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        parts = line.split(":")
        if len(parts) not in (2, 3):
            raise ApiKeyFileError(f"{where}: expected KEY:SECRET or KEY:SECRET:ROLE")
        name, secret, role = parts[0], parts[1], parts[2] if len(parts) == 3 else ADMINISTRATOR
        if not _KEY_NAME.fullmatch(name):
            raise ApiKeyFileError(f"{where}: a key's name is letters, digits, '-' and '_'")
        if not 3 <= len(secret) <= 128:
            raise ApiKeyFileError(f"{where}: a secret is 3 to 128 characters (EMQX's bounds)")
        if role not in (ADMINISTRATOR, VIEWER):
            raise ApiKeyFileError(f"{where}: role {role!r}: expected administrator or viewer")
        if name in keys:
            raise ApiKeyFileError(f"{where}: key {name!r} is listed twice")
        keys[name] = ApiKey(secret.encode(), role)
    if not keys:
        raise ApiKeyFileError(f"{path}: no API keys")
    return keys


def credentials(request: web.Request) -> tuple[str, str] | None:
    """(key, secret) from `Authorization: Basic`, else from `X-Api-Key`; None when neither
    holds a well-formed pair (another scheme, bad base64: all the same to the caller)."""
    header = request.headers.get(hdrs.AUTHORIZATION)
    if header is not None:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            pair = base64.b64decode(encoded.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
    else:
        pair = request.headers.get(KEY_HEADER, "")
    name, colon, secret = pair.partition(":")
    return (name, secret) if colon else None


def _refusal(status: int, code: str, message: str) -> web.Response:
    response = web.json_response({"code": code, "message": message}, status=status)
    if status == 401:
        response.headers[hdrs.WWW_AUTHENTICATE] = _CHALLENGE
    return response


class ApiKeys:
    """The keys in force, and the middleware that asks for them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen = _signature(str(path))
        self._keys = self._read()  # raises: a broker does not start on a bad file
        self.failures: dict[str, int] = {}

    def _read(self) -> dict[str, ApiKey]:
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise ApiKeyFileError(f"api_key.bootstrap_file {self.path}: {error}") from None
        return parse_api_keys(text, str(self.path))

    def _current(self) -> dict[str, ApiKey]:
        seen = _signature(str(self.path))
        if seen != self._seen:
            self._seen = seen  # a bad version is reported once, not on every request
            try:
                self._keys = self._read()
            except ApiKeyFileError as error:
                log.error("reloading the API keys failed, the previous ones stay in force: %s",
                          error)
            else:
                log.info("reloaded the API keys from %s", self.path)
        return self._keys

    def role(self, name: str, secret: str) -> str | None:
        """The key's role when the secret is its own, compared in constant time. Key names
        are not secret (EMQX shows them), so an unknown one may answer sooner."""
        key = self._current().get(name)
        if key is None or not hmac.compare_digest(secret.encode(), key.secret):
            return None
        return key.role

    def _refuse(self, reason: str, status: int, code: str, message: str) -> web.Response:
        self.failures[reason] = self.failures.get(reason, 0) + 1
        return _refusal(status, code, message)

    def middleware(self, metrics_need_key: bool, logins: Logins) -> Middleware:
        @web.middleware
        async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
            path = request.path
            if (path in OPEN_PATHS or logins.public(path)
                    or (path in METRICS_PATHS and not metrics_need_key)):
                return await handler(request)
            token = bearer_token(request)
            given = credentials(request)
            if token is not None:
                role = logins.role(token)
                if role is None:
                    return self._refuse("token_expired", 401, "TOKEN_TIME_OUT",
                                        "the dashboard login expired or was logged out")
            elif given is None:
                return self._refuse("missing", 401, "BAD_API_KEY_OR_SECRET",
                                    "an API key is required (HTTP Basic: KEY:SECRET)")
            else:
                role = self.role(*given)
                if role is None:
                    return self._refuse("rejected", 401, "BAD_API_KEY_OR_SECRET",
                                        "Check api_key/api_secret")
            if role != ADMINISTRATOR and request.method not in _READ_METHODS:
                return self._refuse("forbidden", 403, "FORBIDDEN",
                                    f"a {role} key may only read (GET)")
            return await handler(request)

        return require_key

    def metrics(self) -> list[Sample]:
        return [("mqtt_http_auth_failures_total", "counter",
                 "HTTP API requests refused: no key (missing), a wrong one (rejected), a"
                 " dashboard token expired or logged out (token_expired), or a viewer's"
                 " change (forbidden)", {"reason": reason}, float(count))
                for reason, count in self.failures.items()]


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _make_key_file(path: Path) -> None:
    """An administrator key readable by the broker's user only from its first byte (a
    chmod after writing would leave a moment where others can read it), renamed into place
    so a crash leaves no half a key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # left by a crash, maybe with another mode
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
        handle.write(f"admin:{secrets.token_hex(32)}\n".encode())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def load_api_keys(config: Config) -> ApiKeys | None:
    """The keys the API asks for, or None for an open API (see the module doc for when)."""
    configured: str = config["api_key.bootstrap_file"]
    if configured:
        return ApiKeys(Path(configured))
    host = config["dashboard.listeners.http.bind"][0]
    if loopback(host):
        log.warning("the HTTP API is open to every local process (%s, no"
                    " api_key.bootstrap_file)%s", host,
                    ": /metrics too, whatever prometheus.enable_basic_auth"
                    if config["prometheus.enable_basic_auth"] else "")
        return None
    path = Path(config["node.data_dir"]) / GENERATED_FILE
    if not path.exists():
        _make_key_file(path)
        log.info("api_key.bootstrap_file not set: made an administrator API key in %s", path)
    log.info("HTTP API keys from %s (KEY:SECRET, e.g. curl -u \"$(cat %s)\")", path, path)
    return ApiKeys(path)


def install(app: web.Application, config: Config, registry: CollectorRegistry,
            logins: Logins) -> ApiKeys | None:
    """Puts the key check in front of every route of `app`, unless the API stays open;
    returns the keys in force (they log in to the dashboard too)."""
    keys = load_api_keys(config)
    if keys is None:
        return None
    app.middlewares.append(keys.middleware(config["prometheus.enable_basic_auth"], logins))
    add_samples(registry, keys.metrics)
    return keys
