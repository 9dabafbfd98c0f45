"""Learned Topic Structure: learning, determinism, persistence and filter matching."""

from hypothesis import given
from hypothesis import strategies as st

from broker.ds.lts import LTS
from broker.mqtt.topic import topic_matches


def learn_all(lts: LTS, topics: list[str]) -> list[tuple[int, tuple[str, ...]]]:
    added: list = []
    return [lts.learn(topic, added) for topic in topics]


def test_varying_levels_collapse_into_one_structure() -> None:
    lts = LTS((100, 10))
    topics = [f"metrics/host{h}/cpu/socket/{s}/core/{c}"
              for h in range(30) for s in range(12) for c in range(12)]
    learn_all(lts, topics)
    structures = {"/".join(lts.structure(s)) for s in lts.streams()}
    assert "metrics/+/cpu/socket/+/core/+" in structures
    # The first 10 hosts were learned as static before the threshold was reached.
    stream, varying = lts.learn("metrics/host25/cpu/socket/11/core/11", [])
    assert lts.structure(stream) == ("metrics", "+", "cpu", "socket", "+", "core", "+")
    assert varying == ("host25", "11", "11")


def test_threshold_per_depth_and_last_repeats() -> None:
    lts = LTS((2, 3))
    learn_all(lts, ["a/x", "b/x"])
    assert lts.learn("c/x", [])[1] == ("c",)  # depth 0: third value is a wildcard
    learn_all(lts, ["a/1", "a/2"])  # a/x already there: 3 static children at depth 1
    assert lts.learn("a/4", [])[1] == ("4",)
    learn_all(lts, ["a/1/p", "a/1/q", "a/1/r"])  # depth 2 uses the last threshold, 3
    assert lts.learn("a/1/s", [])[1] == ("s",)


def test_seen_topics_keep_their_stream() -> None:
    lts = LTS((1,))
    first, varying = lts.learn("t/1", [])
    assert varying == ()
    learn_all(lts, [f"t/{i}" for i in range(2, 50)])
    assert lts.learn("t/1", []) == (first, ())
    assert lts.learn("t/99", [])[0] != first


def test_topic_lengths_are_different_streams() -> None:
    lts = LTS((10,))
    (a, _), (ab, _) = learn_all(lts, ["a", "a/b"])
    assert a != ab
    assert sorted(lts.match("a/#")) == sorted([a, ab])
    assert lts.match("a") == [a]
    assert lts.match("a/+") == [ab]


def test_learning_is_deterministic_and_rebuilt_from_edges() -> None:
    topics = [f"s/{i % 37}/x/{i % 5}" for i in range(500)]
    one, two = LTS((4, 2)), LTS((4, 2))
    added: list = []
    routes = [one.learn(t, added) for t in topics]
    assert routes == learn_all(two, topics)
    assert added == one.edges()
    rebuilt = LTS.from_json(one.to_json())
    assert [rebuilt.learn(t, []) for t in topics] == routes
    assert rebuilt.edges() == one.edges()  # nothing new was learned


def test_dollar_topics_are_not_matched_by_leading_wildcards() -> None:
    lts = LTS((10,))
    (sys_stream, _), (plain, _) = learn_all(lts, ["$SYS/x", "a/x"])
    assert lts.match("#") == [plain]
    assert lts.match("+/x") == [plain]
    assert lts.match("$SYS/#") == [sys_stream]


level = st.sampled_from(["a", "b", "c", "d", "e", ""])
topic = st.lists(level, min_size=1, max_size=4).map("/".join)
filter_level = st.sampled_from(["a", "b", "c", "+"])
topic_filter = st.tuples(st.lists(filter_level, min_size=1, max_size=4), st.booleans()).map(
    lambda parts: "/".join(parts[0] + (["#"] if parts[1] else []))
)


@given(st.lists(topic, min_size=1, max_size=40), topic_filter, st.integers(1, 3))
def test_match_finds_every_stream_holding_a_matching_topic(topics, flt, threshold) -> None:
    lts = LTS((threshold,))
    routes = learn_all(lts, topics)
    found = set(lts.match(flt))
    for name, (stream, _) in zip(topics, routes, strict=True):
        if topic_matches(flt, name):
            assert stream in found, (name, flt)
