"""Topic names, filters, shared subscriptions and matching (MQTT 5.0 4.7, 4.8.2)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.mqtt.constants import ReasonCode
from broker.mqtt.errors import ProtocolError
from broker.mqtt.topic import (
    parse_shared,
    split_levels,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

MATCHES: list[tuple[str, str, bool]] = [
    # exact
    ("a/b", "a/b", True),
    ("a/b", "a/c", False),
    ("a/b", "a/b/c", False),
    ("a/b/c", "a/b", False),
    ("a", "A", False),
    ("/", "/", True),
    ("a//b", "a//b", True),
    # '+'
    ("+", "a", True),
    ("+", "a/b", False),
    ("+", "/", False),
    ("+/+", "/", True),  # '+' matches an empty level
    ("/+", "/", True),
    ("a/+", "a/", True),
    ("a/+", "a", False),
    ("a/+/c", "a/b/c", True),
    ("a/+/c", "a//c", True),
    ("a/+/c", "a/b/d", False),
    ("+/b", "/b", True),
    ("+/+/+", "a/b/c", True),
    ("+/+/+", "a/b", False),
    # '#'
    ("#", "a", True),
    ("#", "a/b/c", True),
    ("#", "/", True),
    ("#", "/a", True),
    ("a/#", "a", True),  # the parent level itself (4.7.1.2)
    ("a/#", "a/", True),
    ("a/#", "a/b/c", True),
    ("a/#", "ab", False),
    ("a/#", "b/a", False),
    ("a/b/#", "a", False),
    ("/#", "/", True),
    ("/#", "a", False),
    ("+/#", "a", True),
    ("+/#", "a/b", True),
    ("a/+/#", "a/b", True),
    ("a/+/#", "a", False),
    # '$' topics (4.7.2)
    ("#", "$SYS/broker/load", False),
    ("+/broker/load", "$SYS/broker/load", False),
    ("+", "$SYS", False),
    ("+/#", "$SYS/x", False),
    ("$SYS/#", "$SYS/broker/load", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/+/load", "$SYS/broker/load", True),
    ("$SYS/broker/load", "$SYS/broker/load", True),
    ("a/$b/+", "a/$b/c", True),
    ("a/#", "a/$SYS", True),  # only the first level is special
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), MATCHES)
def test_topic_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected


@pytest.mark.parametrize("topic", ["a", "a/b", "/", "//", "$SYS/x", "a b", "\u00e9/\U0001f600"])
def test_valid_topic_names(topic: str) -> None:
    validate_topic_name(topic)


@pytest.mark.parametrize("topic", ["", "+", "#", "a/+", "a/#", "a+", "a#b", "a\x00b"])
def test_invalid_topic_names(topic: str) -> None:
    with pytest.raises(ProtocolError) as info:
        validate_topic_name(topic)
    assert info.value.reason_code == ReasonCode.TOPIC_NAME_INVALID


@pytest.mark.parametrize(
    "topic_filter",
    ["a", "#", "+", "a/#", "a/+", "+/+", "/+", "+/", "/#", "a/+/b/#", "//", "$SYS/#",
     "$share/g/a", "a b/+"],
)  # fmt: skip
def test_valid_topic_filters(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    "topic_filter",
    ["", "a#", "#/a", "a/#/b", "a/b#", "##", "+a", "a+", "a/+b", "a/b+/c", "++", "+#", "a/#/",
     "a\x00"],
)  # fmt: skip
def test_invalid_topic_filters(topic_filter: str) -> None:
    with pytest.raises(ProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("$share/g/a/+", ("g", "a/+")),
        ("$share/group/#", ("group", "#")),
        ("$share/g//x", ("g", "/x")),
        ("$share/g/a", ("g", "a")),
        ("a/+", (None, "a/+")),
        ("$share", (None, "$share")),
        ("$shared/g/a", (None, "$shared/g/a")),
        ("$SHARE/g/a", (None, "$SHARE/g/a")),
        ("x/$share/g/a", (None, "x/$share/g/a")),
    ],
)
def test_parse_shared(topic_filter: str, expected: tuple[str | None, str]) -> None:
    assert parse_shared(topic_filter) == expected


@pytest.mark.parametrize(
    "topic_filter",
    ["$share/g", "$share/g/", "$share//x", "$share/", "$share/g+/x", "$share/+/x",
     "$share/g#/x", "$share/#/x", "$share/#"],
)  # fmt: skip
def test_parse_shared_invalid(topic_filter: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_shared(topic_filter)
    assert info.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID


def test_split_levels() -> None:
    assert split_levels("a/b/c") == ["a", "b", "c"]
    assert split_levels("/a/") == ["", "a", ""]
    assert split_levels("a") == ["a"]
    assert split_levels("") == [""]


# --- matching against a regex oracle -------------------------------------------------------


def oracle(topic_filter: str, topic: str) -> bool:
    """Independent reference: translate the filter to a regular expression."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    levels = topic_filter.split("/")
    multi = levels[-1] == "#"
    if multi:
        levels = levels[:-1]
    pattern = "/".join("[^/]*" if lvl == "+" else re.escape(lvl) for lvl in levels)
    if multi:
        pattern = ".*" if not levels else pattern + "(/.*)?"
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


# Small alphabets make collisions (and therefore matches) likely.
level = st.sampled_from(["", "a", "b", "ab", "$", "$SYS"])
topics = st.lists(level, min_size=1, max_size=5).map("/".join).filter(bool)
filters = st.builds(
    lambda levels, hash_: "/".join(levels + (["#"] if hash_ else [])),
    st.lists(st.sampled_from(["", "a", "b", "+", "$SYS"]), max_size=5),
    st.booleans(),
).filter(bool)


@settings(max_examples=1000, deadline=None)
@given(filters, topics)
def test_topic_matches_oracle(topic_filter: str, topic: str) -> None:
    validate_topic_filter(topic_filter)
    validate_topic_name(topic)
    assert topic_matches(topic_filter, topic) is oracle(topic_filter, topic)


@settings(max_examples=300, deadline=None)
@given(topics)
def test_topic_matches_itself_and_hash(topic: str) -> None:
    assert topic_matches(topic, topic)
    assert topic_matches("#", topic) is not topic.startswith("$")
