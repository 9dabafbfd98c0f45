"""The pure parts of authorization with an HTTP service: how its answers read, the TTL cache
(bounded, expiring, emptied with the ACL file), and which source decides what."""

from pathlib import Path

from broker.auth.acl import Access, parse_acl_file
from broker.auth.authorization import AclCache, HttpAuthorization, Verdict
from broker.auth.client_rules import parse_client_rules
from broker.auth.http_client import HttpService
from broker.auth.http_requests import UNAVAILABLE, Answer, RequestTemplate, interpret_authorization
from broker.auth.security import Security
from broker.config.loader import load_config

URL = "http://127.0.0.1:9/authz"  # never called: these tests ask nothing over the network


def test_answers_as_emqx_reads_them() -> None:
    assert interpret_authorization(200, b'{"result": "allow"}') == Answer(True)
    assert interpret_authorization(204, b"") == Answer(True)
    assert interpret_authorization(200, b'{"result": "deny"}') == Answer(False)
    assert interpret_authorization(200, b'{"result": "ignore"}') == Answer(None)
    for status, body in ((500, b""), (200, b"not json"), (200, b'{"result": "maybe"}'),
                         (200, b'["allow"]'), (403, b'{"result": "allow"}')):
        assert interpret_authorization(status, body) is UNAVAILABLE, (status, body)


def _http(max_size: int = 2, ttl: float = 10.0) -> HttpAuthorization:
    service = HttpService(RequestTemplate(URL, "post", {}, {}), 1.0, 1, 1)
    return HttpAuthorization(service, max_size, ttl)


def test_the_cache_is_bounded_and_expires() -> None:
    http, cache = _http(), AclCache(0)
    one, two, three = (("publish", f"t/{n}", 1, False) for n in (1, 2, 3))
    assert http.known(cache, one, 0.0) is None
    http.remember(cache, one, True, 0.0)
    http.remember(cache, two, False, 1.0)
    assert http.known(cache, one, 5.0) is True and http.known(cache, two, 5.0) is False
    assert http.known(cache, one, 10.0) is None  # its ttl ran out
    http.remember(cache, one, True, 10.0)
    http.remember(cache, three, True, 10.0)  # full: the oldest (two) goes
    assert cache.asked is not None and list(cache.asked) == [one, three]
    cache.refresh(1)  # another ACL file: nothing it decided stays
    assert http.known(cache, three, 11.0) is None


def test_a_cache_off_or_without_ttl_keeps_nothing() -> None:
    for http in (_http(max_size=0), _http(ttl=0.0)):
        cache = AclCache(0)
        http.remember(cache, ("publish", "t", 0, False), True, 0.0)
        assert http.known(cache, ("publish", "t", 0, False), 0.0) is None


def test_the_file_in_emqx_chain_passes_on_what_it_has_no_rule_for() -> None:
    acl = parse_acl_file("topic read r/#\ntopic deny r/secret\n", "acl")
    assert acl.decide("c", None, "r/1", Access.READ) is True
    assert acl.decide("c", None, "r/secret", Access.READ) is False
    assert acl.decide("c", None, "other", Access.READ) is None
    assert acl.allows("c", None, "other", Access.READ) is False  # Mosquitto's answer


def _security(tmp_path: Path, *settings: str, acl: str | None = None) -> Security:
    lines = list(settings)
    if acl is not None:
        (tmp_path / "acl").write_text(acl)
        lines.append(f"authorization.acl_file={tmp_path / 'acl'}")
    return Security(load_config(None, lines))


def test_no_match_decides_when_no_source_does(tmp_path: Path) -> None:
    closed = _security(tmp_path, "authorization.no_match=deny")
    assert closed.authorizes
    assert not closed.allows(AclCache(0), "c", None, "t", Access.WRITE)
    rules = parse_client_rules([{"permission": "allow", "action": "all", "topic": "own/#"}],
                               "c", None)
    assert closed.allows(AclCache(0, rules), "c", None, "own/1", Access.WRITE)
    assert not _security(tmp_path).authorizes  # nothing to ask: no cache per connection


def test_with_the_service_deliveries_are_vetoed_only_by_a_rule(tmp_path: Path) -> None:
    security = _security(tmp_path, f"authorization.http.url={URL}",
                         "authorization.no_match=deny", acl="topic deny d/#\n")
    cache = AclCache(security.generation)
    assert security.allows(cache, "c", None, "d/1", Access.READ) is False
    assert security.allows(cache, "c", None, "elsewhere", Access.READ) is True
    # the credentials' rules answer at once; anything else waits for the service
    rules = parse_client_rules([{"permission": "deny", "action": "publish", "topic": "x"}],
                               "c", None)
    ruled = AclCache(security.generation, rules)
    assert security.authorize_now(ruled, "publish", "x", 0, False) is Verdict.DENY
    assert security.authorize_now(ruled, "publish", "y", 0, False) is None
