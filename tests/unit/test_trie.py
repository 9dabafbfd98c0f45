from hypothesis import given
from hypothesis import strategies as st

from broker.mqtt.topic import topic_matches
from broker.routing.trie import TopicTrie

levels = st.sampled_from(["a", "b", "$SYS", "", "c"])
topics = st.lists(levels, min_size=1, max_size=4).map("/".join)
filter_levels = st.sampled_from(["a", "b", "$SYS", "", "+"])


@st.composite
def filters(draw: st.DrawFn) -> str:
    parts = draw(st.lists(filter_levels, min_size=1, max_size=4))
    if draw(st.booleans()):
        parts.append("#")
    return "/".join(parts)


@given(st.lists(filters(), max_size=12, unique=True), topics)
def test_match_agrees_with_topic_matches(stored: list[str], topic: str) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for index, topic_filter in enumerate(stored):
        trie.add(topic_filter, "k", index)
    found = sorted(f for f, _, _ in trie.match(topic))
    assert found == sorted(f for f in stored if topic_matches(f, topic))


@given(st.lists(topics, max_size=12, unique=True), filters())
def test_match_filter_agrees_with_topic_matches(stored: list[str], topic_filter: str) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for index, topic in enumerate(stored):
        trie.add(topic, None, index)
    found = sorted(t for t, _, _ in trie.match_filter(topic_filter))
    assert found == sorted(t for t in stored if topic_matches(topic_filter, t))


def test_remove_prunes_and_counts() -> None:
    trie: TopicTrie[int] = TopicTrie()
    assert trie.add("a/b/c", "x", 1)
    assert not trie.add("a/b/c", "x", 2)
    assert trie.add("a/+", "y", 3)
    assert len(trie) == 2
    assert trie.remove("a/b/c", "x") == 2
    assert trie.remove("a/b/c", "x") is None
    assert list(trie.match("a/b/c")) == []
    assert [v for _, _, v in trie.match("a/z")] == [3]
    assert len(trie) == 1
