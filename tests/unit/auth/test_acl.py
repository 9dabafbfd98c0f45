"""The ACL file's decisions, as Mosquitto makes them."""

import pytest

from broker.auth.acl import Access, AclFileError, parse_acl_file

R, W = Access.READ, Access.WRITE


def test_deny_wins_over_an_earlier_allow_and_nothing_matching_is_denied() -> None:
    acl = parse_acl_file("user a\ntopic readwrite #\ntopic deny x/secret\n", "f")
    assert acl.allows("c", "a", "x/open", W)
    assert not acl.allows("c", "a", "x/secret", R)
    assert not acl.allows("c", "b", "x/open", R)  # a user with no rules and no patterns


def test_rules_before_the_first_user_are_the_anonymous_clients() -> None:
    acl = parse_acl_file("topic read pub/#\nuser a\ntopic write a/#\n", "f")
    assert acl.allows("c", None, "pub/x", R)
    assert not acl.allows("c", None, "pub/x", W)
    assert not acl.allows("c", "a", "pub/x", R)


def test_dollar_topics_need_a_dollar_rule() -> None:
    acl = parse_acl_file("user a\ntopic read #\ntopic read $SYS/broker/#\n", "f")
    assert acl.allows("c", "a", "$SYS/broker/uptime", R)
    assert not acl.allows("c", "a", "$SYS/other", R)


def test_patterns_substitute_whole_levels_and_refuse_wildcard_identities() -> None:
    acl = parse_acl_file("pattern readwrite dev/%c/#\npattern read in/%u\n", "f")
    assert acl.allows("s1", "u", "dev/s1/t", W)
    assert not acl.allows("s1", "u", "dev/s2/t", W)
    assert acl.allows("s1", "u", "in/u", R)
    assert not acl.allows("s1", None, "in/u", R)  # no user name: %u matches nothing
    assert not acl.allows("+", "u", "dev/x/t", W)  # would widen the rule


def test_a_subscription_filter_is_checked_as_a_topic_name() -> None:
    acl = parse_acl_file("user a\ntopic read a/#\ntopic read b/x\n", "f")
    assert acl.allows("c", "a", "a/+/z", R)
    assert not acl.allows("c", "a", "b/+", R)


@pytest.mark.parametrize(("text", "message"), [
    ("user a\nfrobnicate x\n", "f:2: unknown keyword 'frobnicate'"),
    ("user\n", "f:1: `user` needs a name"),
    ("topic read\n", "f:1: `topic` needs a topic filter"),
    ("topic read a/#/b\n", "f:1:"),
])
def test_errors_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(AclFileError, match=message):
        parse_acl_file(text, "f")
