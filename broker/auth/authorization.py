"""What a connection may do, and what it was told: the per-connection cache of decisions, and
EMQX's HTTP authorization (`authorization.http.*`).

With the HTTP service the chain for a PUBLISH, SUBSCRIBE or will is EMQX's: the rules that
came with the client's credentials, then the service (`allow`, `deny`, `ignore`), then the
ACL file, where a topic without a rule passes on too, then `authorization.no_match`. A
service that cannot be asked (busy: `max_inflight` requests out) or that fails (an error
status, a bad answer, no answer in time) refuses the action: it is not passed on, since the
service might have said `deny`.

Decisions made with the service are kept `authorization.cache.ttl`, keyed by action, topic,
QoS and retain (the body may use all four); without it the cache holds the file's decisions
by topic until the file changes (`generation`), as before.
"""

from enum import Enum
from typing import TYPE_CHECKING, Final

from broker.auth.client_rules import ClientRule
from broker.auth.http_requests import Answer, interpret_authorization

if TYPE_CHECKING:  # made only when configured (security.py): aiohttp comes with it
    from broker.auth.http_client import HttpService

Key = tuple[str, str, int, bool]  # action, topic (or filter), QoS, retain


class Verdict(Enum):
    ALLOW = "allow"
    DENY = "deny"
    BUSY = "busy"  # not asked: too many requests out
    FAILED = "failed"  # asked, no usable answer


# How each refusal is said in a PUBACK, PUBREC or SUBACK (v5), and counted.
REFUSAL_CODES: Final = {Verdict.DENY: 0x87, Verdict.BUSY: 0x97, Verdict.FAILED: 0x80}


class AclCache:
    """One connection's decisions by topic, one table per access (`authorization.cache.
    max_size` each, the oldest dropped), valid for one generation of the ACL file. Plain
    dicts keyed by the topic: a hit, every message but a topic's first, is one lookup with
    nothing allocated (`Connection.authorized` looks there before calling `allows`).
    `rules`: the ACL that came with the client's credentials, asked before the file.
    `asked`: with the HTTP service, its chain's decisions and until when they hold."""

    __slots__ = ("asked", "generation", "read", "rules", "write")

    def __init__(self, generation: int, rules: tuple[ClientRule, ...] = ()) -> None:
        self.generation = generation
        self.read: dict[str, bool] = {}
        self.write: dict[str, bool] = {}
        self.asked: dict[Key, tuple[bool, float]] | None = None
        self.rules = rules

    def refresh(self, generation: int) -> None:
        """Forgets what an earlier ACL file decided."""
        if self.generation != generation:
            self.read.clear()
            self.write.clear()
            if self.asked is not None:
                self.asked.clear()
            self.generation = generation


class HttpAuthorization:
    def __init__(self, service: "HttpService", max_size: int, ttl: float) -> None:
        self.service = service
        self._max_size = max_size  # 0: the cache is off
        self._ttl = ttl

    def known(self, cache: AclCache, key: Key, now: float) -> bool | None:
        """A decision still in force; None: the service must be asked."""
        asked = cache.asked
        entry = asked.get(key) if asked is not None else None
        if entry is None:
            return None
        if entry[1] > now:
            return entry[0]
        del asked[key]  # type: ignore[union-attr]
        return None

    def remember(self, cache: AclCache, key: Key, allowed: bool, now: float) -> None:
        if not self._max_size or self._ttl <= 0:
            return
        asked = cache.asked
        if asked is None:
            asked = cache.asked = {}
        asked.pop(key, None)  # re-made: it goes to the young end
        if len(asked) >= self._max_size:
            del asked[next(iter(asked))]
        asked[key] = (allowed, now + self._ttl)

    async def ask(self, values: dict[str, str]) -> Answer:
        return await self.service.ask(values, interpret_authorization)
