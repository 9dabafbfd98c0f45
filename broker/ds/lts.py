"""Learned Topic Structure: a trie of topic levels that learns which levels vary.

Each node counts its distinct static children. While that count is below the threshold for
the node's depth a new level value gets an edge of its own; past it, the node grows one `+`
edge and every new value goes there. `metrics/<host>/cpu` with thousands of hosts thus
becomes one structure `metrics/+/cpu`: one stream whose `+` values are indexed (keys.py)
instead of thousands of tiny streams. A topic ends with an END edge; the END node's id is the
stream's id, so `a/b` and `a/b/c` are different streams.

Learning is a pure function of the order topics are seen in and of the thresholds; the
edges a batch adds are returned so the cooker can store them with the data (a replica or a
restart rebuilds the same trie from them, and never re-learns). Topics already seen keep
their stream because their static edges stay.
"""

from collections.abc import Iterable, Iterator
from typing import Any, Final

PLUS: Final = "+"
END: Final = "\x00"  # MQTT forbids U+0000 in topics, so no level can be mistaken for it
ROOT: Final = 0

Edge = tuple[int, str, int]


class LTS:
    def __init__(self, thresholds: Iterable[int], edges: Iterable[Edge] = ()) -> None:
        self.thresholds = tuple(thresholds)
        if not self.thresholds or min(self.thresholds) < 1:
            raise ValueError("wildcard thresholds must be positive")
        self._edges: dict[tuple[int, str], int] = {}
        self._children: dict[int, dict[str, int]] = {}
        self._paths: dict[int, tuple[str, ...]] = {ROOT: ()}
        self._order: list[Edge] = []
        self._next = ROOT + 1
        for edge in edges:
            self.add_edge(*edge)

    def _threshold(self, depth: int) -> int:
        thresholds = self.thresholds
        return thresholds[depth] if depth < len(thresholds) else thresholds[-1]

    def add_edge(self, parent: int, level: str, child: int) -> None:
        """Idempotent, so edges replayed from disk or a log may overlap what is known."""
        if (parent, level) in self._edges:
            return
        self._edges[parent, level] = child
        self._children.setdefault(parent, {})[level] = child
        self._paths[child] = self._paths[parent] + (level,)
        self._order.append((parent, level, child))
        self._next = max(self._next, child + 1)

    def _new_edge(self, parent: int, level: str, added: list[Edge]) -> int:
        child = self._next
        self.add_edge(parent, level, child)
        added.append((parent, level, child))
        return child

    def learn(self, topic: str, added: list[Edge]) -> tuple[int, tuple[str, ...]]:
        """The stream of `topic` and the values of its varying levels, learning as needed;
        new edges are appended to `added`."""
        edges = self._edges
        node = ROOT
        varying: list[str] = []
        for depth, level in enumerate(topic.split("/")):
            child = edges.get((node, level))
            if child is None:
                wild = edges.get((node, PLUS))
                if wild is not None:
                    child = wild
                    varying.append(level)
                elif self._static_children(node) < self._threshold(depth):
                    child = self._new_edge(node, level, added)
                else:
                    child = self._new_edge(node, PLUS, added)
                    varying.append(level)
            node = child
        stream = edges.get((node, END))
        if stream is None:
            stream = self._new_edge(node, END, added)
        return stream, tuple(varying)

    def _static_children(self, node: int) -> int:
        children = self._children.get(node, {})
        return len(children) - (END in children) - (PLUS in children)

    def structure(self, stream: int) -> tuple[str, ...]:
        """The stream's topic levels with `+` where they vary (END dropped)."""
        return self._paths[stream][:-1]

    def streams(self) -> list[int]:
        return [child for _, level, child in self._order if level == END]

    def match(self, topic_filter: str) -> list[int]:
        """Streams that may hold topics matching the filter (a superset: the `+` edge of a
        level holds every value, so readers still check each topic)."""
        found: list[int] = []
        self._match(ROOT, 0, topic_filter.split("/"), found)
        return sorted(found)

    def _match(self, node: int, depth: int, levels: list[str], found: list[int]) -> None:
        children = self._children.get(node, {})
        if depth == len(levels):
            if END in children:
                found.append(children[END])
            return
        wanted = levels[depth]
        if wanted == "#":
            found.extend(self._subtree_streams(node, depth == 0))
        elif wanted == PLUS:
            for level, child in children.items():
                if level != END and not (depth == 0 and level.startswith("$")):
                    self._match(child, depth + 1, levels, found)
        else:
            for level in (wanted, PLUS):
                if level in children:
                    self._match(children[level], depth + 1, levels, found)

    def _subtree_streams(self, node: int, at_root: bool) -> Iterator[int]:
        stack = [
            child for level, child in self._children.get(node, {}).items()
            if not (at_root and level.startswith("$"))
        ]
        while stack:
            current = stack.pop()
            if self._paths[current][-1] == END:
                yield current
            stack.extend(self._children.get(current, {}).values())

    def edges(self) -> list[Edge]:
        """Every edge in the order it was learned: replaying them rebuilds this trie."""
        return list(self._order)

    def to_json(self) -> dict[str, Any]:
        return {"thresholds": list(self.thresholds), "edges": [list(e) for e in self._order]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LTS":
        return cls(data["thresholds"], (tuple(edge) for edge in data["edges"]))
