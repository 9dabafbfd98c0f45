"""Who may connect and what they may do: the password file and the ACL file, live.

Both files are read at start-up (a bad one stops the broker, naming file and line) and again
on SIGHUP or when they change on disk (a Kubernetes Secret is updated in place, by a symlink
swap): a reload that fails keeps the version in force and logs why. Connections are never
dropped by a reload; their cached ACL decisions are, through `generation`.

Password hashes are checked on worker threads (`hashlib` releases the GIL), never on the
event loop, whatever iteration count the file asks for. At most `_MAX_PENDING` checks wait
at once; a CONNECT beyond that is answered "server busy" at once, so a flood of bad CONNECTs
costs a bounded queue and good clients behind it wait at most that long.
"""

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from broker.auth.acl import Access, Acl, AclFileError, parse_acl_file
from broker.auth.passwords import Hash, PasswordFileError, parse_password_file
from broker.config.loader import Config
from broker.mqtt.constants import ReasonCode

log = logging.getLogger(__name__)

_MAX_PENDING: Final = 1024
_WORKERS: Final = 2
_WATCH_INTERVAL: Final = 1.0

Signature = tuple[int, int, int, int]  # (device, inode, size, mtime ns) of the file read


class SecurityFileError(ValueError):
    pass


@dataclass(slots=True)
class SecurityStats:
    auth_failures: dict[str, int] = field(default_factory=dict)
    denied: dict[str, int] = field(default_factory=dict)
    reloads: dict[str, int] = field(default_factory=dict)

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


class AclCache:
    """One connection's decisions by topic, one table per access (`authorization.cache.
    max_size` each, the oldest dropped), valid for one generation of the ACL file. Plain
    dicts keyed by the topic: a hit, every message but a topic's first, is one lookup with
    nothing allocated (`Connection.authorized` looks there before calling `allows`)."""

    __slots__ = ("generation", "read", "write")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.read: dict[str, bool] = {}
        self.write: dict[str, bool] = {}


class Security:
    def __init__(self, config: Config) -> None:
        self._password_path: str = config["authentication.password_file"]
        self._acl_path: str = config["authorization.acl_file"]
        anonymous: str = config["authentication.allow_anonymous"]
        self.allow_anonymous = anonymous == "true" or (anonymous == "auto"
                                                       and not self._password_path)
        self.disconnect_on_deny = config["authorization.deny_action"] == "disconnect"
        self.cache_size: int = config["authorization.cache.max_size"]
        self.stats = SecurityStats()
        self.generation = 0
        self.users: dict[str, Hash | None] | None = None
        self.acl: Acl | None = None
        self._signatures: dict[str, Signature | None] = {}
        self._pending = 0
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        for path in (self._password_path, self._acl_path):
            if path:
                self._load(path)  # raises: a broker does not start on a bad file

    @property
    def checks_credentials(self) -> bool:
        """Whether a CONNECT waits for `authenticate` (off the fast path otherwise)."""
        return self.users is not None or not self.allow_anonymous

    # ---- files -----------------------------------------------------------------------------
    def _load(self, path: str) -> None:
        signature = _signature(path)
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise SecurityFileError(f"{path}: {error}") from None
        try:
            if path == self._password_path:
                users, warnings = parse_password_file(text, path)
                for warning in warnings:
                    log.warning("%s", warning)
                self.users = users
            else:
                self.acl = parse_acl_file(text, path)
                self.generation += 1
        except (PasswordFileError, AclFileError) as error:
            raise SecurityFileError(str(error)) from None
        self._signatures[path] = signature

    def reload(self, reason: str) -> None:
        """SIGHUP, or a file changed: each file read again; one that fails keeps its
        previous version."""
        for path in (self._password_path, self._acl_path):
            if not path:
                continue
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
            self._executor = ThreadPoolExecutor(_WORKERS, thread_name_prefix="password")
        if self._password_path or self._acl_path:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_INTERVAL)
            changed = [path for path, seen in self._signatures.items()
                       if _signature(path) != seen]
            if changed:
                self.reload(f"{', '.join(changed)} changed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- authentication --------------------------------------------------------------------
    async def authenticate(self, username: str | None, password: bytes | None) -> ReasonCode:
        """SUCCESS, or why the CONNECT is refused. Never logs the password."""
        if username is None and password is None:
            if self.allow_anonymous:
                return ReasonCode.SUCCESS
            return self._fail("anonymous", ReasonCode.NOT_AUTHORIZED)
        users = self.users
        if users is None:  # no password file: credentials are not checked
            return ReasonCode.SUCCESS
        hashed = users.get(username or "")
        if hashed is None or password is None:
            return self._fail("unknown_user" if username not in users else "bad_password",
                              ReasonCode.BAD_USER_NAME_OR_PASSWORD)
        if self._pending >= _MAX_PENDING:
            return self._fail("busy", ReasonCode.SERVER_BUSY)
        assert self._executor is not None
        self._pending += 1
        try:
            ok = await asyncio.get_running_loop().run_in_executor(self._executor,
                                                                  hashed.matches, password)
        finally:
            self._pending -= 1
        if not ok:
            return self._fail("bad_password", ReasonCode.BAD_USER_NAME_OR_PASSWORD)
        return ReasonCode.SUCCESS

    def _fail(self, reason: str, code: ReasonCode) -> ReasonCode:
        self.stats.count(self.stats.auth_failures, reason)
        return code

    # ---- authorization ---------------------------------------------------------------------
    def allows(self, cache: AclCache, client_id: str, username: str | None, topic: str,
               access: Access) -> bool:
        acl = self.acl
        if acl is None:
            return True
        if cache.generation != self.generation:
            cache.read.clear()
            cache.write.clear()
            cache.generation = self.generation
        decisions = cache.read if access is Access.READ else cache.write
        decided = decisions.get(topic)
        if decided is None:
            decided = acl.allows(client_id, username, topic, access)
            if len(decisions) >= self.cache_size:
                del decisions[next(iter(decisions))]
            decisions[topic] = decided
        if not decided:
            self.stats.count(self.stats.denied, "read" if access is Access.READ else "write")
        return decided

    def metrics(self) -> list[tuple[str, str, str, dict[str, str], float]]:
        stats = self.stats
        return [
            *(("mqtt_auth_failures_total", "counter", "CONNECTs refused by authentication",
               {"reason": reason}, float(n)) for reason, n in stats.auth_failures.items()),
            *(("mqtt_acl_denied_total", "counter", "Actions refused by the ACL file",
               {"action": action}, float(n)) for action, n in stats.denied.items()),
            *(("mqtt_security_reloads_total", "counter",
               "Password and ACL file reloads, by result", {"result": result}, float(n))
              for result, n in stats.reloads.items()),
        ]


def _signature(path: str) -> Signature | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
