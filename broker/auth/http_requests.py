"""EMQX's HTTP authentication and authorization, the pure part: the request a CONNECT (or
an action) makes and what the service's answer means.

The body is a JSON template whose string values may hold `${clientid}`, `${username}`,
`${password}`, `${peerhost}`, `${topic}` and `${action}`; they are replaced inside the parsed
values, so a user name with quotes in it cannot change the document's shape. A GET sends
the same fields as its query string. The answer, as EMQX reads it: 200 with
`{"result": "allow"|"deny"|"ignore", "is_superuser": BOOL, "acl": [...]}`, or 204 (allow);
anything else, a timeout or a refused connection is "ignore" (the next source decides) and
is remembered as the service being unavailable.
"""

import json
from typing import Any, Final, NamedTuple

from broker.auth.client_rules import ClientRule, ClientRulesError, parse_client_rules

_MAX_ANSWER: Final = 64 * 1024


class RequestTemplate(NamedTuple):
    url: str
    method: str  # "post" or "get"
    headers: dict[str, str]
    body: dict[str, Any]


class Request(NamedTuple):
    method: str
    url: str
    headers: dict[str, str]
    params: dict[str, str] | None
    json: dict[str, Any] | None


class Answer(NamedTuple):
    """`allowed` None: ignore (the next source decides); `unavailable`: the service did not
    answer usably; `busy`: it was not asked, `max_inflight` requests being out already."""

    allowed: bool | None
    superuser: bool = False
    rules: tuple[ClientRule, ...] | None = None
    unavailable: bool = False
    busy: bool = False


UNAVAILABLE: Final = Answer(None, unavailable=True)
BUSY: Final = Answer(None, unavailable=True, busy=True)
_IGNORE: Final = Answer(None)
_DENY: Final = Answer(False)


def render(template: RequestTemplate, values: dict[str, str]) -> Request:
    body = {key: _fill(value, values) for key, value in template.body.items()}
    if template.method == "get":
        return Request("GET", template.url, template.headers,
                       {key: value if isinstance(value, str) else json.dumps(value)
                        for key, value in body.items()}, None)
    return Request("POST", template.url, template.headers, None, body)


def _fill(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, replacement in values.items():
            value = value.replace("${" + name + "}", replacement)
        return value
    if isinstance(value, dict):
        return {key: _fill(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill(item, values) for item in value]
    return value


def _document(status: int, body: bytes) -> dict[str, Any] | None:
    """The answer's JSON object with a known `result`; None for an unusable answer. 204 is
    `{"result": "allow"}`."""
    if status == 204:
        return {"result": "allow"}
    if status != 200 or len(body) > _MAX_ANSWER:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("result") not in ("allow", "deny",
                                                                          "ignore"):
        return None
    return document


def interpret(status: int, body: bytes, client_id: str, username: str | None) -> Answer:
    """An authentication answer: with `allow`, maybe a superuser and an ACL."""
    document = _document(status, body)
    if document is None:
        return UNAVAILABLE
    result = document["result"]
    if result != "allow":
        return _IGNORE if result == "ignore" else _DENY
    rules = None
    if "acl" in document:
        try:
            rules = parse_client_rules(document["acl"], client_id, username)
        except ClientRulesError:
            return _DENY
    return Answer(True, document.get("is_superuser") is True, rules)


def interpret_authorization(status: int, body: bytes) -> Answer:
    """An authorization answer: allow, deny or ignore, nothing else in it is read."""
    document = _document(status, body)
    if document is None:
        return UNAVAILABLE
    return {"allow": Answer(True), "deny": _DENY}.get(document["result"], _IGNORE)
