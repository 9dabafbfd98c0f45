"""Topic names, topic filters and shared subscriptions (MQTT 5.0 section 4.7, 4.8.2).

Pure functions on `str`. The decoder only guarantees non-empty, valid UTF-8 without U+0000;
filter syntax is checked here by the connection so that a bad filter costs one SUBACK 0x8F
instead of the whole connection.
"""

from typing import Final

from broker.mqtt.constants import ReasonCode
from broker.mqtt.errors import ProtocolError

__all__ = [
    "parse_shared",
    "split_levels",
    "topic_matches",
    "validate_topic_filter",
    "validate_topic_name",
]

_SHARE_PREFIX: Final = "$share/"


def split_levels(topic: str) -> list[str]:
    """Topic levels; empty levels are kept ("a//b" has three, "/a" starts with "")."""
    return topic.split("/")


def validate_topic_name(topic: str) -> None:
    """A PUBLISH/will topic: non-empty, no wildcards, no U+0000 (4.7.3, 1.5.4)."""
    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
        raise ProtocolError(f"invalid topic name {topic!r}", ReasonCode.TOPIC_NAME_INVALID)


def validate_topic_filter(topic_filter: str) -> None:
    """A subscription filter: non-empty; '#' only as the whole last level; '+' only as a
    whole level (4.7.1). A "$share/..." filter is checked as an ordinary string here; call
    `parse_shared` first and validate the returned filter to check a shared subscription."""
    if not topic_filter or "\x00" in topic_filter:
        raise ProtocolError(
            f"invalid topic filter {topic_filter!r}", ReasonCode.TOPIC_FILTER_INVALID
        )
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if ("#" in level and (level != "#" or i != last)) or ("+" in level and level != "+"):
            raise ProtocolError(
                f"invalid topic filter {topic_filter!r}", ReasonCode.TOPIC_FILTER_INVALID
            )


def parse_shared(topic_filter: str) -> tuple[str | None, str]:
    """Split "$share/{group}/{filter}" into (group, filter); other filters -> (None, filter).

    The group must be non-empty without '+', '#' (4.8.2) and the filter non-empty. The
    returned filter is not validated further: pass it to `validate_topic_filter`.
    """
    if not topic_filter.startswith(_SHARE_PREFIX):
        return None, topic_filter
    group, sep, inner = topic_filter[len(_SHARE_PREFIX) :].partition("/")
    if not sep or not group or not inner or "+" in group or "#" in group:
        raise ProtocolError(
            f"invalid shared subscription {topic_filter!r}", ReasonCode.TOPIC_FILTER_INVALID
        )
    return group, inner


STREAM_PREFIX = "$stream/"


def parse_stream(topic_filter: str) -> tuple[str, str | None] | None:
    """(name, topic filter or None) of a stream subscription `$stream/<name>[/<filter>]`
    (EMQX 6.1's MQTT Streams); None for any other filter."""
    if not topic_filter.startswith(STREAM_PREFIX):
        return None
    name, _, inner = topic_filter[len(STREAM_PREFIX):].partition("/")
    return name, inner or None


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether a (valid, non-shared) filter matches a topic name (4.7).

    "a/#" also matches "a" (the parent level), "+" matches an empty level, and topics that
    start with '$' are not matched by filters starting with a wildcard (4.7.2).
    """
    if topic[:1] == "$" and topic_filter[:1] in ("+", "#"):
        return False
    if "+" not in topic_filter and "#" not in topic_filter:
        return topic_filter == topic
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    n = len(t_levels)
    for i, level in enumerate(f_levels):
        if level == "#":
            return True
        if i >= n or (level != "+" and level != t_levels[i]):
            return False
    return len(f_levels) == n
