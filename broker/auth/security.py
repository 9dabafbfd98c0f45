"""Who may connect and what they may do: the password file, JWTs, an HTTP service, SCRAM
users (MQTT 5 enhanced authentication) and the ACL file, live.

A CONNECT's user name and password go through `authentication.order` (EMQX's chain): each
configured source allows, denies, or passes ("ignore") to the next. A user the password file
does not know, a password that is not a JWT, an HTTP answer "ignore" or no answer at all pass
on; when every source passed, a CONNECT with credentials is refused (0x86, or 0x88 Server
unavailable if the HTTP service did not answer) and one without is anonymous.

The files are read at start-up (a bad one stops the broker, naming file and line) and again
on SIGHUP or when they change on disk (a Kubernetes Secret is updated in place, by a symlink
swap): a reload that fails keeps the version in force and logs why. Connections are never
dropped by a reload; their cached ACL decisions are, through `generation`.

Password hashes are checked on worker threads (`hashlib` releases the GIL; hash_workers.py),
never on the event loop, whatever iteration count the file asks for. At most `_MAX_PENDING`
checks wait at once; a CONNECT beyond that is answered "server busy" at once, so a flood
of bad CONNECTs costs a bounded queue and good clients behind it wait at most that long.
"""

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, TypeVar

from broker.auth.acl import Access, Acl, AclFileError, parse_acl_file
from broker.auth.authorization import AclCache, HttpAuthorization, Verdict
from broker.auth.client_rules import ClientRule, decide
from broker.auth.enhanced import EnhancedAuth
from broker.auth.hash_workers import HashWorkers
from broker.auth.http_requests import RequestTemplate, interpret
from broker.auth.passwords import Hash, PasswordFileError, parse_password_file
from broker.auth.scram import METHODS
from broker.auth.scram_users import ScramFileError, ScramUser, dump_scram_file, parse_scram_file
from broker.config.loader import Config
from broker.ds.files import write_atomically
from broker.mqtt.constants import ReasonCode

if TYPE_CHECKING:  # imported where configured: aiohttp, PyJWT and cryptography cost a broker
    # that uses neither a third of a second of start-up (tests/unit/test_startup_imports.py)
    from broker.auth.http_client import HttpService
    from broker.auth.tokens import JwtVerifier

log = logging.getLogger(__name__)

_MAX_PENDING: Final = 1024
_WORKERS: Final = 2
_WATCH_INTERVAL: Final = 1.0

K = TypeVar("K")
Signature = tuple[int, int, int, int]  # (device, inode, size, mtime ns) of the file read


class SecurityFileError(ValueError):
    pass


class SecurityStats:
    """(A plain class: a dataclass costs a start ~0.5 ms to build, issue 42.)"""

    __slots__ = ("auth_failures", "denied", "reloads", "unavailable")

    def __init__(self) -> None:
        self.auth_failures: dict[str, int] = {}
        self.denied: dict[str, int] = {}
        self.reloads: dict[str, int] = {}
        self.unavailable: dict[tuple[str, str], int] = {}  # action, why

    def count(self, table: dict[K, int], key: K) -> None:
        table[key] = table.get(key, 0) + 1


class Outcome(NamedTuple):
    """A CONNECT's authentication: the reason code, and what it says about the connection
    (no ACL for a superuser, rules that came with the credentials, a JWT's expiry)."""

    code: ReasonCode
    superuser: bool = False
    rules: tuple[ClientRule, ...] | None = None
    expires_at: float | None = None


Later = Callable[[Outcome | BaseException], None]
_SUCCESS: Final = Outcome(ReasonCode.SUCCESS)
"""The plain success, shared (a NamedTuple is immutable): not one made per CONNECT."""


class _Later:
    """`_check_file`'s answer while the password is checked: the outcome comes later."""


_LATER: Final = _Later()


def _settle(answer: "asyncio.Future[Outcome]", result: Outcome | BaseException) -> None:
    if answer.cancelled():  # the CONNECT's Task was cancelled meanwhile
        return
    if isinstance(result, BaseException):
        answer.set_exception(result)
    else:
        answer.set_result(result)


class Security:
    def __init__(self, config: Config) -> None:
        self._password_path: str = config["authentication.password_file"]
        self._acl_path: str = config["authorization.acl_file"]
        self._scram_path: str = config["authentication.scram.user_file"]
        self._jwks_path: str = config["authentication.jwt.jwks_file"]
        self._jwks_url: str = config["authentication.jwt.endpoint"]
        self._jwks_refresh: float = config["authentication.jwt.refresh_interval"]
        self.scram_iterations: int = config["authentication.scram.iteration_count"]
        self.scram_users: dict[str, ScramUser] | None = None
        # Salts of unknown SCRAM users are made with it: random per process, so they
        # cannot be told from real ones, and stable while it runs.
        self._mock_key = secrets.token_bytes(32)
        self.jwt = _jwt_verifier(config)
        self.disconnect_after_expire: bool = config["authentication.jwt.disconnect_after_expire"]
        self.http = _http_service(config, "authentication.http.")
        # Whether `authenticate_now` can decide: no source in the chain answers in a
        # coroutine (the HTTP service). An attribute, as `_derive`'s: read per CONNECT.
        self.answers_now = self.http is None
        authz_service = _http_service(config, "authorization.http.")
        # The cache's size, 0 when it is off (every decision made again).
        self.cache_size: int = (config["authorization.cache.max_size"]
                                if config["authorization.cache.enable"] else 0)
        self.http_authz = None if authz_service is None else HttpAuthorization(
            authz_service, self.cache_size, config["authorization.cache.ttl"])
        self.no_match: bool = config["authorization.no_match"] == "allow"
        self._order: tuple[str, ...] = config["authentication.order"]
        anonymous: str = config["authentication.allow_anonymous"]
        sources = self._password_path or self.jwt is not None or self.http is not None
        self.allow_anonymous = anonymous == "true" or (anonymous == "auto" and not sources)
        self.disconnect_on_deny = config["authorization.deny_action"] == "disconnect"
        self.stats = SecurityStats()
        self.generation = 0
        self.users: dict[str, Hash | None] | None = None
        self.acl: Acl | None = None
        self._signatures: dict[str, Signature | None] = {}
        self._pending = 0
        self._hashing: HashWorkers | None = None
        self._tasks: list[asyncio.Task[None]] = []  # the files' watch, the JWKS fetches
        self._derive()
        for path in self._paths():
            self._load(path)  # raises: a broker does not start on a bad file

    def _paths(self) -> list[str]:
        return [path for path in (self._password_path, self._acl_path, self._scram_path,
                                  self._jwks_path) if path]

    def _derive(self) -> None:
        """`authorizes`: whether a connection's actions are asked about (it gets an
        `AclCache`); `checks_credentials`: whether a CONNECT waits for `authenticate` (off
        the fast path otherwise). Attributes set when a file is read, not properties: each
        CONNECT reads both, and a property of this (interpreted) class is a Python call."""
        self.authorizes = self.acl is not None or self.http_authz is not None or not self.no_match
        self.checks_credentials = (self.users is not None or self.jwt is not None
                                   or self.http is not None or not self.allow_anonymous)

    # ---- files -----------------------------------------------------------------------------
    def _load(self, path: str) -> None:
        signature = _signature(path)
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            if path != self._scram_path:
                raise SecurityFileError(f"{path}: no such file") from None
            text = ""  # made by the first `broker ctl users add --scram` or API call
        except (OSError, UnicodeDecodeError) as error:
            raise SecurityFileError(f"{path}: {error}") from None
        try:
            if path == self._password_path:
                users, warnings = parse_password_file(text, path)
                for warning in warnings:
                    log.warning("%s", warning)
                self.users = users
            elif path == self._scram_path:
                self.scram_users = parse_scram_file(text, path)
            elif path == self._jwks_path:
                self._use_jwks(text, path)
            else:
                self.acl = parse_acl_file(text, path)
                self.generation += 1
        except (PasswordFileError, AclFileError, ScramFileError) as error:
            raise SecurityFileError(str(error)) from None
        self._signatures[path] = signature
        self._derive()

    def _use_jwks(self, text: str, path: str) -> None:
        from broker.auth.tokens import JwtConfigError  # with the verifier (`_jwt_verifier`)

        assert self.jwt is not None
        try:
            self.jwt.use_jwks(text, path)
        except JwtConfigError as error:
            raise SecurityFileError(str(error)) from None

    def reload(self, reason: str) -> None:
        """SIGHUP, or a file changed: each file read again; one that fails keeps its
        previous version."""
        for path in self._paths():
            try:
                self._load(path)
            except SecurityFileError as error:
                self.stats.count(self.stats.reloads, "failed")
                log.error("reloading %s (%s) failed, the previous version stays in force: %s",
                          path, reason, error)
                continue
            self.stats.count(self.stats.reloads, "ok")
            log.info("reloaded %s (%s)", path, reason)

    def start(self) -> None:
        if self._password_path:
            self._hashing = HashWorkers(_workers(), "password")
        loop = asyncio.get_running_loop()
        if self._paths():
            self._tasks.append(loop.create_task(self._watch()))
        if self._jwks_url:
            from broker.auth.jwks_endpoint import refresh_forever  # (aiohttp: `_jwt_verifier`)

            assert self.jwt is not None
            self._tasks.append(loop.create_task(refresh_forever(
                self._jwks_url, self._jwks_refresh, self.jwt,
                lambda result: self.stats.count(self.stats.reloads, result))))

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_INTERVAL)
            changed = [path for path, seen in self._signatures.items()
                       if _signature(path) != seen]
            if changed:
                self.reload(f"{', '.join(changed)} changed")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._hashing is not None:
            self._hashing.stop()
        if self.http is not None:
            await self.http.close()
        if self.http_authz is not None:
            await self.http_authz.service.close()

    # ---- authentication --------------------------------------------------------------------
    def authenticate_now(self, client_id: str, username: str | None, password: bytes | None,
                         later: Later) -> Outcome | None:
        """`authenticate` without coroutines, when `answers_now`: the outcome, or None while
        the password is checked on the workers, when `later` gets the outcome (or what the
        check raised). A CONNECT then continues in one callback instead of a Task that
        awaits two coroutines (creation, scheduling, three loop turns)."""
        anonymous = username is None and password is None
        if self.users is None and self.jwt is None:
            return self._unchecked(anonymous)
        for source in self._order:
            outcome: Outcome | _Later | None
            if source == "file":
                outcome = self._check_file(username, password, later)
                if isinstance(outcome, _Later):
                    return None
            elif source == "jwt":
                outcome = self._check_jwt(client_id, username, password)
            else:  # the HTTP service, not configured: it passes
                continue
            if outcome is not None:
                return outcome
        return self._passed(anonymous, False)

    async def authenticate(self, client_id: str, username: str | None,
                           password: bytes | None, peer: Callable[[], str]) -> Outcome:
        """SUCCESS, or why the CONNECT is refused. Never logs the password. `peer` gives the
        client's address, which only HTTP authentication asks (a system call per CONNECT)."""
        anonymous = username is None and password is None
        if self.users is None and self.jwt is None and self.http is None:
            return self._unchecked(anonymous)
        unavailable = False
        for source in self._order:
            if source == "file":
                outcome = await self._check_file_later(username, password)
            elif source == "jwt":
                outcome = self._check_jwt(client_id, username, password)
            else:
                outcome, missed = await self._check_http(client_id, username, password, peer)
                unavailable = unavailable or missed
            if outcome is not None:
                return outcome
        return self._passed(anonymous, unavailable)

    def _unchecked(self, anonymous: bool) -> Outcome:
        """No source: credentials are not checked, only their absence."""
        if anonymous and not self.allow_anonymous:
            return self._fail("anonymous", ReasonCode.NOT_AUTHORIZED)
        return _SUCCESS

    def _passed(self, anonymous: bool, unavailable: bool) -> Outcome:
        """Every source passed: anonymous clients as configured, credentials refused."""
        if anonymous:
            if self.allow_anonymous:
                return _SUCCESS
            return self._fail("anonymous", ReasonCode.NOT_AUTHORIZED)
        if unavailable:
            return self._fail("http_unavailable", ReasonCode.SERVER_UNAVAILABLE)
        return self._fail("unknown_user", ReasonCode.BAD_USER_NAME_OR_PASSWORD)

    def _check_file(self, username: str | None, password: bytes | None,
                    later: Later) -> Outcome | _Later | None:
        """None: not a user of the file; _LATER: the password is being checked."""
        users = self.users
        if users is None or username is None or username not in users:
            return None
        hashed = users[username]
        if hashed is None or password is None:
            return self._fail("bad_password", ReasonCode.BAD_USER_NAME_OR_PASSWORD)
        if self._pending >= _MAX_PENDING:
            return self._fail("busy", ReasonCode.SERVER_BUSY)
        assert self._hashing is not None
        self._pending += 1
        self._hashing.check(partial(hashed.matches, password), partial(self._checked, later))
        return _LATER

    def _checked(self, later: Later, result: bool | BaseException) -> None:
        self._pending -= 1
        if isinstance(result, BaseException):
            later(result)
        elif result:
            later(_SUCCESS)
        else:
            later(self._fail("bad_password", ReasonCode.BAD_USER_NAME_OR_PASSWORD))

    async def _check_file_later(self, username: str | None,
                                password: bytes | None) -> Outcome | None:
        answer: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        outcome = self._check_file(username, password, partial(_settle, answer))
        if isinstance(outcome, _Later):
            return await answer
        return outcome

    def _check_jwt(self, client_id: str, username: str | None,
                   password: bytes | None) -> Outcome | None:
        jwt = self.jwt
        if jwt is None:
            return None
        token = password if jwt.settings.source == "password" else (
            username.encode() if username is not None else None)
        if token is None:
            return None
        verdict = jwt.verify(token, client_id, username)
        if verdict.allowed is None:
            return None
        if not verdict.allowed:
            return self._fail(f"jwt_{verdict.reason}", ReasonCode.BAD_USER_NAME_OR_PASSWORD)
        return Outcome(ReasonCode.SUCCESS, False, verdict.rules, verdict.expires_at)

    async def _check_http(self, client_id: str, username: str | None, password: bytes | None,
                          peer: Callable[[], str]) -> tuple[Outcome | None, bool]:
        """The outcome (None: ignore) and whether the service failed to answer."""
        http = self.http
        if http is None:
            return None, False
        values = {"clientid": client_id, "username": username or "",
                  "password": password.decode(errors="replace") if password else "",
                  "peerhost": peer().rpartition(":")[0]}
        answer = await http.ask(
            values, lambda status, body: interpret(status, body, client_id, username))
        if answer.allowed is None:
            return None, answer.unavailable
        if not answer.allowed:
            return self._fail("http_deny", ReasonCode.BAD_USER_NAME_OR_PASSWORD), False
        return Outcome(ReasonCode.SUCCESS, answer.superuser, answer.rules), False

    def _fail(self, reason: str, code: ReasonCode) -> Outcome:
        self.count_failure(reason)
        return Outcome(code)

    def count_failure(self, reason: str) -> None:
        self.stats.count(self.stats.auth_failures, reason)

    # ---- enhanced authentication (SCRAM) ---------------------------------------------------
    def enhanced(self, method: str) -> EnhancedAuth | None:
        """The exchange for a CONNECT's Authentication Method; None: not offered (0x8C)."""
        if self.scram_users is None or method not in METHODS:
            return None
        return EnhancedAuth(method, self._scram_user, self._mock_key)

    def _scram_user(self, user_id: str) -> ScramUser | None:
        return self.scram_users.get(user_id) if self.scram_users is not None else None

    def save_scram_users(self, users: dict[str, ScramUser]) -> None:
        """The HTTP API's change: written (atomically, 0600) and in force at once."""
        path = Path(self._scram_path)
        write_atomically(path, dump_scram_file(users).encode(), 0o600)
        self.scram_users = users
        self._signatures[self._scram_path] = _signature(self._scram_path)

    # ---- authorization ---------------------------------------------------------------------
    def allows(self, cache: AclCache, client_id: str, username: str | None, topic: str,
               access: Access) -> bool:
        """The credentials' rules first, then the ACL file. Without the HTTP service this
        decides every action; with it, only deliveries (`authorize_now` and `authorize`
        decide the actions)."""
        cache.refresh(self.generation)
        decisions = cache.read if access is Access.READ else cache.write
        decided = decisions.get(topic)
        if decided is None:
            decided = decide(cache.rules, topic, access) if cache.rules else None
            if decided is None:
                decided = self._file_decides(client_id, username, topic, access)
            if self.cache_size:
                if len(decisions) >= self.cache_size:
                    del decisions[next(iter(decisions))]
                decisions[topic] = decided
        if not decided:
            self.stats.count(self.stats.denied, "read" if access is Access.READ else "write")
        return decided

    def _file_decides(self, client_id: str, username: str | None, topic: str,
                      access: Access) -> bool:
        acl = self.acl
        if self.http_authz is None:  # Mosquitto's file: no rule, denied
            return acl.allows(client_id, username, topic, access) if acl is not None \
                else self.no_match
        # A delivery: its subscription was decided already; the file only vetoes by a rule.
        decided = acl.decide(client_id, username, topic, access) if acl is not None else None
        return decided is not False

    def authorize_now(self, cache: AclCache, action: str, topic: str, qos: int,
                      retain: bool) -> Verdict | None:
        """With the HTTP service: the decision the credentials' rules or the cache hold;
        None: the service is to be asked (`authorize`)."""
        assert self.http_authz is not None
        access = Access.WRITE if action == "publish" else Access.READ
        decided = decide(cache.rules, topic, access) if cache.rules else None
        if decided is None:
            cache.refresh(self.generation)
            decided = self.http_authz.known(cache, (action, topic, qos, retain),
                                            time.monotonic())
        return None if decided is None else self._verdict(decided, access)

    async def authorize(self, cache: AclCache, client_id: str, username: str | None,
                        peer: str, action: str, topic: str, qos: int, retain: bool) -> Verdict:
        """The service, then the file, then `no_match`; for what `authorize_now` left."""
        http = self.http_authz
        assert http is not None
        answer = await http.ask({
            "clientid": client_id, "username": username or "", "peerhost": peer.rpartition(
                ":")[0], "topic": topic, "action": action, "qos": str(qos),
            "retain": "true" if retain else "false"})
        if answer.unavailable:
            verdict = Verdict.BUSY if answer.busy else Verdict.FAILED
            self.stats.count(self.stats.unavailable, (action, verdict.value))
            return verdict
        access = Access.WRITE if action == "publish" else Access.READ
        decided = answer.allowed
        if decided is None and self.acl is not None:
            decided = self.acl.decide(client_id, username, topic, access)
        if decided is None:
            decided = self.no_match
        cache.refresh(self.generation)
        http.remember(cache, (action, topic, qos, retain), decided, time.monotonic())
        return self._verdict(decided, access)

    def _verdict(self, allowed: bool, access: Access) -> Verdict:
        if allowed:
            return Verdict.ALLOW
        self.stats.count(self.stats.denied, "read" if access is Access.READ else "write")
        return Verdict.DENY

    def metrics(self) -> list[tuple[str, str, str, dict[str, str], float]]:
        stats = self.stats
        return [
            *(("mqtt_auth_failures_total", "counter",
               "CONNECTs and re-authentications refused, and connections ended by an expired"
               " JWT, by reason",
               {"reason": reason}, float(n)) for reason, n in stats.auth_failures.items()),
            *(("mqtt_acl_denied_total", "counter", "Actions refused by the ACL file",
               {"action": action}, float(n)) for action, n in stats.denied.items()),
            *(("mqtt_authz_unavailable_total", "counter",
               "Actions refused because the HTTP authorization service could not be asked"
               " (busy: max_inflight requests out) or did not answer usably (failed)",
               {"action": action, "reason": reason}, float(n))
              for (action, reason), n in stats.unavailable.items()),
            *(("mqtt_security_reloads_total", "counter",
               "Security file reloads and JWKS fetches, by result", {"result": result}, float(n))
              for result, n in stats.reloads.items()),
        ]


def _jwt_verifier(config: Config) -> "JwtVerifier | None":
    """None when no key is configured (JWT is then not in the chain, and PyJWT and
    cryptography are not imported)."""
    prefix = "authentication.jwt."
    secret, public_key = config[prefix + "secret"], config[prefix + "public_key"]
    jwks, endpoint = config[prefix + "jwks_file"], config[prefix + "endpoint"]
    if not (secret or public_key or jwks or endpoint):
        return None
    if sum(map(bool, (secret, public_key, jwks, endpoint))) > 1:
        raise SecurityFileError("authentication.jwt: set one of secret, public_key, jwks_file,"
                                " endpoint")
    from broker.auth.tokens import JwtSettings, JwtVerifier

    verifier = JwtVerifier(JwtSettings(config[prefix + "from"], config[prefix + "leeway"],
                                       config[prefix + "verify_claims"],
                                       config[prefix + "acl_claim_name"]))
    try:
        if secret:
            verifier.use_secret(secret, config[prefix + "secret_base64_encoded"])
        elif public_key:
            pem = public_key if "-----BEGIN" in public_key else Path(public_key).read_text()
            verifier.use_public_key(pem)
    except (OSError, ValueError) as error:
        raise SecurityFileError(f"{prefix}: {error}") from None
    return verifier


def _http_service(config: Config, prefix: str) -> "HttpService | None":
    """None without a URL (and aiohttp's client is not imported)."""
    url = config[prefix + "url"]
    if not url:
        return None
    from broker.auth.http_client import HttpService

    template = RequestTemplate(url, config[prefix + "method"], config[prefix + "headers"],
                               config[prefix + "body"])
    return HttpService(template, config[prefix + "request_timeout"], config[prefix + "pool_size"],
                       config[prefix + "max_inflight"])


def _workers() -> int:
    """Hashing threads: up to `_WORKERS`, leaving the event loop a CPU of its own. Threads
    beyond the CPUs the process may use only take turns on them (a broker pinned to one
    core switched its 2 workers 0.5 times per CONNECT, 1 worker 0.3 times) and hand their
    answers back later, the checks of a batch finishing together."""
    return max(1, min(_WORKERS, len(os.sched_getaffinity(0)) - 1))


def _signature(path: str) -> Signature | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
