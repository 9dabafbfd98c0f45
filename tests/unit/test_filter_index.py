"""The durable filter index: exact filters in a dict, wildcard ones in a trie, and a count of
distinct entries per topic name whichever way they match."""

from broker.routing.filter_index import FilterIndex


def test_exact_filters_count_their_entries_once() -> None:
    index = FilterIndex()
    assert index.add("a/b", "c1") is True
    assert index.add("a/b", "c1") is False
    assert index.add("a/b", "c2") is True
    assert (index.matches("a/b"), index.matches("a/c"), len(index)) == (2, 0, 2)
    assert index.remove("a/b", "c1") is True
    assert index.remove("a/b", "c1") is False
    assert index.matches("a/b") == 1
    assert index.remove("a/b", "c2") is True
    assert (index.matches("a/b"), len(index)) == (0, 0)


def test_an_entry_matching_by_several_filters_counts_once() -> None:
    index = FilterIndex()
    index.add("a/b", "c1")
    index.add("a/+", "c1")
    index.add("#", "c2")
    index.add("a/#", "g")
    assert index.matches("a/b") == 3
    assert index.matches("x") == 1
    assert index.matches("$SYS/a") == 0  # wildcards do not match `$` topics
    assert index.remove("a/+", "c1") is True
    assert index.remove("a/+", "c1") is False
    assert index.matches("a/b") == 3  # c1 still by its exact filter
    assert len(index) == 3


def test_removing_an_entry_that_is_not_there_changes_nothing() -> None:
    index = FilterIndex()
    index.add("a/b", "c1")
    index.add("a/b", "c2")
    assert index.remove("a/b", "c3") is False
    assert index.remove("x/#", "c1") is False
    assert (index.matches("a/b"), len(index)) == (2, 2)
