"""ACL rules that come with a client's credentials: the `acl` claim of a JWT, or the `acl`
of an HTTP authentication answer, in EMQX's two formats. Pure.

    [{"permission": "allow"|"deny", "action": "publish"|"subscribe"|"all",
      "topic": "t/${clientid}/#"}, ...]                   (EMQX 5.7 and later)
    {"pub": [FILTER...], "sub": [FILTER...], "all": [FILTER...]}   (before: allows only)

`${clientid}` and `${username}` in a topic are replaced by the connection's; a topic
written `eq t/#` matches only that exact filter. The first rule that matches decides; when
none does, the next source (the ACL file) is asked, as EMQX's client-info source passes on.
"""

from typing import Any, Final, NamedTuple

from broker.auth.acl import Access
from broker.mqtt.topic import topic_matches

_ACTIONS: Final = {"publish": Access.WRITE, "pub": Access.WRITE,
                   "subscribe": Access.READ, "sub": Access.READ,
                   "all": Access.READ | Access.WRITE}
MAX_RULES: Final = 1000


class ClientRulesError(ValueError):
    pass


class ClientRule(NamedTuple):
    allow: bool
    access: Access
    topic: str
    exact: bool

    def matches(self, topic: str, access: Access) -> bool:
        if not self.access & access:
            return False
        return topic == self.topic if self.exact else topic_matches(self.topic, topic)


def parse_client_rules(raw: Any, client_id: str, username: str | None) -> tuple[ClientRule, ...]:
    """ClientRulesError for anything else than the two formats (the credentials are then
    refused: an ACL the broker cannot read must not be taken as no ACL)."""
    if isinstance(raw, dict):
        raw = [{"permission": "allow", "action": action, "topic": topic}
               for action, topics in raw.items() for topic in _list(topics)]
    if not isinstance(raw, list) or len(raw) > MAX_RULES:
        raise ClientRulesError(f"an acl must be a list of at most {MAX_RULES} rules or a map")
    rules = []
    for entry in raw:
        if not isinstance(entry, dict):
            raise ClientRulesError("an acl rule must be an object")
        permission, action, topic = (entry.get("permission"), entry.get("action"),
                                     entry.get("topic"))
        if permission not in ("allow", "deny") or action not in _ACTIONS or not isinstance(
                topic, str) or not topic:
            raise ClientRulesError(f"bad acl rule {entry!r:.80}")
        exact = topic.startswith("eq ")
        topic = topic[3:] if exact else topic
        if "${" in topic and _widens(client_id, username):
            continue  # a `+` or `#` in an ID would widen the rule: it never matches
        topic = topic.replace("${clientid}", client_id).replace("${username}", username or "")
        rules.append(ClientRule(permission == "allow", _ACTIONS[action], topic, exact))
    return tuple(rules)


def _widens(client_id: str, username: str | None) -> bool:
    return any(c in value for value in (client_id, username or "") for c in "+#")


def _list(topics: Any) -> list[Any]:
    if not isinstance(topics, list):
        raise ClientRulesError("acl pub/sub/all must be lists of topics")
    return topics


def decide(rules: tuple[ClientRule, ...], topic: str, access: Access) -> bool | None:
    """True/False from the first rule that matches; None: none does."""
    for rule in rules:
        if rule.matches(topic, access):
            return rule.allow
    return None
