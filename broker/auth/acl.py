"""Mosquitto's ACL file and its decisions. Pure.

    file    := line*
    line    := "user" NAME | "topic" [access] FILTER | "pattern" [access] FILTER
             | "#" comment | blank
    access  := "read" | "write" | "readwrite" (the default) | "deny"

`topic` lines before the first `user` line apply to anonymous clients, later ones to the
user named above them; `pattern` lines apply to everyone wherever they stand, with `%c`
(client ID) and `%u` (user name) standing for a whole topic level. As in Mosquitto:

- a client's own rules are looked at first, then the patterns; within each, `deny` rules
  before the others, so a deny anywhere wins over an allow in the same list;
- the first rule whose filter matches decides; nothing matching means denied;
- a topic starting with `$` is matched only by rules starting with `$` (`#` does not give
  `$SYS`);
- a SUBSCRIBE is checked with its filter taken as a topic name (rule `a/#` allows
  subscribing to `a/+/b`), and every message is checked again for `read` on its own topic
  when it is delivered, so a broad subscription never carries a denied topic;
- a client ID or user name containing `+` or `#` never matches a pattern (it could widen
  the rule).
"""

from enum import IntFlag
from typing import Final, NamedTuple

from broker.mqtt.errors import MQTTError
from broker.mqtt.topic import topic_matches, validate_topic_filter


class Access(IntFlag):
    NONE = 0
    READ = 1  # subscribe and receive
    WRITE = 2  # publish (wills and retained messages included)


_ACCESS: Final = {"read": Access.READ, "write": Access.WRITE,
                  "readwrite": Access.READ | Access.WRITE, "deny": Access.NONE}


class AclFileError(ValueError):
    pass


class Rule(NamedTuple):
    access: Access
    filter: str


class Acl:
    """(A plain class: a dataclass costs a start ~0.5 ms to build, issue 42.)"""

    __slots__ = ("anonymous", "patterns", "users")

    def __init__(self) -> None:
        self.anonymous: list[Rule] = []
        self.users: dict[str, list[Rule]] = {}
        self.patterns: list[Rule] = []

    def allows(self, client_id: str, username: str | None, topic: str, access: Access) -> bool:
        """Mosquitto's answer: a topic no rule matches is denied."""
        return self.decide(client_id, username, topic, access) or False

    def decide(self, client_id: str, username: str | None, topic: str,
               access: Access) -> bool | None:
        """None when no rule matches (EMQX's file source then passes to the next one)."""
        own = self.anonymous if username is None else self.users.get(username, [])
        decided = _first_match(own, topic, access)
        if decided is not None:
            return decided
        if not self.patterns or "+" in client_id or "#" in client_id or (
                username is not None and ("+" in username or "#" in username)):
            return None
        rules = [Rule(rule.access, _substitute(rule.filter, client_id, username))
                 for rule in self.patterns]
        return _first_match(rules, topic, access)


def _first_match(rules: list[Rule], topic: str, access: Access) -> bool | None:
    dollar = topic.startswith("$")
    for rule in rules:  # deny rules come first: parse_acl_file puts them there
        if dollar and not rule.filter.startswith("$"):
            continue
        if topic_matches(rule.filter, topic):
            if rule.access is Access.NONE:
                return False
            if rule.access & access:
                return True
    return None


def _substitute(topic_filter: str, client_id: str, username: str | None) -> str:
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if level == "%c":
            levels[index] = client_id
        elif level == "%u":
            # A client without a user name matches no %u rule: a level that cannot occur.
            levels[index] = username if username is not None else "\0"
    return "/".join(levels)


def parse_acl_file(text: str, name: str) -> Acl:
    acl = Acl()
    current = acl.anonymous
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        rest = rest.strip()
        if keyword == "user":
            if not rest:
                raise AclFileError(f"{name}:{number}: `user` needs a name")
            current = acl.users.setdefault(rest, [])
            continue
        if keyword not in ("topic", "pattern"):
            raise AclFileError(f"{name}:{number}: unknown keyword {keyword!r} (expected user,"
                               " topic or pattern)")
        first, _, after = rest.partition(" ")
        access, topic_filter = (_ACCESS[first], after.strip()) if first in _ACCESS \
            else (Access.READ | Access.WRITE, rest)
        if not topic_filter:
            raise AclFileError(f"{name}:{number}: `{keyword}` needs a topic filter")
        try:
            validate_topic_filter(topic_filter)
        except MQTTError as error:
            raise AclFileError(f"{name}:{number}: {error}") from None
        rules = acl.patterns if keyword == "pattern" else current
        rule = Rule(access, topic_filter)
        if access is Access.NONE:
            denies = sum(1 for r in rules if r.access is Access.NONE)
            rules.insert(denies, rule)
        else:
            rules.append(rule)
    return acl
