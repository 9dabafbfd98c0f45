"""A topic trie keyed by filter levels, used both for subscriptions and retained topics.

Matching walks only the branches a topic can reach (exact level, `+`, `#`), so a publish
costs O(levels x matching branches), not O(subscriptions). Values are stored per filter under
an arbitrary hashable key (a client ID, a share group member...), which keeps the trie
ignorant of sessions.
"""

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


class _Node(Generic[V]):
    __slots__ = ("children", "filter", "values")

    def __init__(self) -> None:
        self.children: dict[str, _Node[V]] = {}
        self.values: dict[Hashable, V] = {}
        self.filter: str = ""


class TopicTrie(Generic[V]):
    """Filters -> {key: value}. `match(topic)` yields (filter, key, value) for every match."""

    def __init__(self) -> None:
        self._root: _Node[V] = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, topic_filter: str, key: Hashable, value: V) -> bool:
        """Stores value; returns True if (filter, key) was not present before."""
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        node.filter = topic_filter
        is_new = key not in node.values
        node.values[key] = value
        self._count += is_new
        return is_new

    def remove(self, topic_filter: str, key: Hashable) -> V | None:
        path: list[tuple[_Node[V], str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            path.append((node, level))
            node = child
        value = node.values.pop(key, None)
        if value is None:
            return None
        self._count -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.values or child.children:
                break
            del parent.children[level]
        return value

    def get(self, topic_filter: str, key: Hashable) -> V | None:
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node.values.get(key)

    def match(self, topic: str) -> Iterator[tuple[str, Hashable, V]]:
        """Every stored (filter, key, value) whose filter matches the topic name."""
        levels = topic.split("/")
        dollar = topic.startswith("$")
        stack: list[tuple[_Node[V], int]] = [(self._root, 0)]
        last = len(levels)
        while stack:
            node, depth = stack.pop()
            children = node.children
            if depth == last:
                yield from self._values_of(node)
                hash_child = children.get("#")
                if hash_child is not None:
                    yield from self._values_of(hash_child)
                continue
            wildcard_ok = not (dollar and depth == 0)
            if wildcard_ok:
                hash_child = children.get("#")
                if hash_child is not None:
                    yield from self._values_of(hash_child)
                plus_child = children.get("+")
                if plus_child is not None:
                    stack.append((plus_child, depth + 1))
            exact = children.get(levels[depth])
            if exact is not None:
                stack.append((exact, depth + 1))

    def match_filter(self, topic_filter: str) -> Iterator[tuple[str, Hashable, V]]:
        """Entries stored under concrete topic names that the filter matches (retained use)."""
        levels = topic_filter.split("/")
        stack: list[tuple[_Node[V], int]] = [(self._root, 0)]
        last = len(levels)
        while stack:
            node, depth = stack.pop()
            if depth == last:
                yield from self._values_of(node)
                continue
            level = levels[depth]
            skip_dollar = depth == 0 and level in ("+", "#")
            if level == "#":
                # '#' matches the parent level itself ("a/#" matches "a") and everything below.
                if depth > 0:
                    yield from self._values_of(node)
                yield from self._subtree(node, skip_dollar)
            elif level == "+":
                for name, child in node.children.items():
                    if not (skip_dollar and name.startswith("$")):
                        stack.append((child, depth + 1))
            else:
                named = node.children.get(level)
                if named is not None:
                    stack.append((named, depth + 1))

    def items(self) -> Iterator[tuple[str, Hashable, V]]:
        yield from self._subtree(self._root, False)

    def _subtree(self, node: _Node[V], skip_dollar: bool) -> Iterator[tuple[str, Hashable, V]]:
        stack = [
            child for name, child in node.children.items()
            if not (skip_dollar and name.startswith("$"))
        ]
        while stack:
            current = stack.pop()
            yield from self._values_of(current)
            stack.extend(current.children.values())

    @staticmethod
    def _values_of(node: _Node[V]) -> Iterator[tuple[str, Hashable, V]]:
        for key, value in node.values.items():
            yield node.filter, key, value
