"""Shard replica placement: which sites hold each shard of the `messages` database.

Pure and deterministic (same inputs, same plan), so the operator can recompute it after any
restart and every reader agrees. Each shard gets min(replication_factor, sites) replicas on
distinct sites; the plan is balanced (replica counts per site differ by at most one) and
changes as few replicas as possible from the previous plan, because every moved replica is
a copy of the shard's data between pods.
"""

import heapq
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Placement = dict[int, tuple[str, ...]]


@dataclass(frozen=True)
class Transition:
    """One shard's change between two plans: replicas to create and replicas to remove."""

    shard: int
    add: tuple[str, ...]
    remove: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {"shard": self.shard, "add": list(self.add), "remove": list(self.remove)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Transition":
        return cls(int(data["shard"]), tuple(data["add"]), tuple(data["remove"]))


def replicas_per_shard(replication_factor: int, sites: int) -> int:
    """The factor applied: at most one replica per site, so a factor above the number of
    sites (a cluster started small) is capped, as the brokers cap it, not refused."""
    return min(replication_factor, sites)


def plan(previous: Mapping[int, Sequence[str]], sites: Sequence[str], n_shards: int,
         replication_factor: int) -> Placement:
    """The balanced plan that keeps the most replicas of `previous`, as a min-cost flow.

    Flow goes source -> shard (`width` units) -> site -> sink. A shard -> site edge costs
    nothing where the shard already has a replica on that site and 1 elsewhere, so the cost
    is the number of replicas to copy. Each site passes `share` units straight to the sink
    and at most one more through a hub that lets `extra` sites carry share + 1: the only
    flows of full value are the balanced plans.
    """
    if not sites:
        return {}
    width = replicas_per_shard(replication_factor, len(sites))
    share, extra = divmod(width * n_shards, len(sites))
    source, hub, sink = 0, 1, 2
    first_site = 3 + n_shards
    flow = _Network(first_site + len(sites))
    shard_site_edges: dict[int, list[tuple[int, str]]] = {}
    for shard in range(n_shards):
        flow.add(source, 3 + shard, width, 0)
        had = set(previous.get(shard, ()))
        shard_site_edges[shard] = [
            (flow.add(3 + shard, first_site + index, 1, 0 if site in had else 1), site)
            for index, site in enumerate(sites)
        ]
    for index in range(len(sites)):
        flow.add(first_site + index, sink, share, 0)
        flow.add(first_site + index, hub, 1, 0)
    flow.add(hub, sink, extra, 0)
    flow.solve(source, sink)
    return {shard: tuple(site for edge, site in edges if flow.used(edge))
            for shard, edges in shard_site_edges.items()}


class _Network:
    """Primal-dual min-cost flow: Dijkstra for potentials, then Dinic on zero-reduced-cost
    edges. With 0/1 costs there are few distinct path costs, so few Dijkstra phases, which
    keeps 1024 shards x 64 sites within a second or two."""

    def __init__(self, nodes: int) -> None:
        self.edges_of: list[list[int]] = [[] for _ in range(nodes)]
        self.head: list[int] = []  # edge e goes to head[e]; e ^ 1 is its reverse
        self.capacity: list[int] = []
        self.cost: list[int] = []

    def add(self, tail: int, head: int, capacity: int, cost: int) -> int:
        edge = len(self.head)
        for a, b, c, w in ((tail, head, capacity, cost), (head, tail, 0, -cost)):
            self.edges_of[a].append(len(self.head))
            self.head.append(b)
            self.capacity.append(c)
            self.cost.append(w)
        return edge

    def used(self, edge: int) -> bool:
        return self.capacity[edge] == 0

    def solve(self, source: int, sink: int) -> None:
        nodes = len(self.edges_of)
        potential = [0] * nodes
        while True:
            distance = self._distances(source, potential)
            if distance[sink] is None:
                return
            for node, d in enumerate(distance):
                if d is not None:
                    potential[node] += d
            while self._augment_blocking(source, sink, potential):
                pass

    def _reduced(self, tail: int, edge: int, potential: list[int]) -> int:
        return self.cost[edge] + potential[tail] - potential[self.head[edge]]

    def _distances(self, source: int, potential: list[int]) -> list[int | None]:
        distance: list[int | None] = [None] * len(self.edges_of)
        distance[source] = 0
        queue = [(0, source)]
        while queue:
            here, node = heapq.heappop(queue)
            if here != distance[node]:
                continue
            for edge in self.edges_of[node]:
                if self.capacity[edge]:
                    head, there = self.head[edge], here + self._reduced(node, edge, potential)
                    known = distance[head]
                    if known is None or there < known:
                        distance[head] = there
                        heapq.heappush(queue, (there, head))
        return distance

    def _augment_blocking(self, source: int, sink: int, potential: list[int]) -> bool:
        """One Dinic round on the admissible (zero reduced cost) residual edges."""
        level = [-1] * len(self.edges_of)
        level[source] = 0
        frontier = [source]
        while frontier:
            following = []
            for node in frontier:
                for edge in self.edges_of[node]:
                    head = self.head[edge]
                    if (self.capacity[edge] and level[head] < 0
                            and self._reduced(node, edge, potential) == 0):
                        level[head] = level[node] + 1
                        following.append(head)
            frontier = following
        if level[sink] < 0:
            return False
        cursor = [0] * len(self.edges_of)
        path: list[int] = []
        node = source
        while True:
            if node == sink:
                for edge in path:  # every shard -> site edge has capacity 1: push one unit
                    self.capacity[edge] -= 1
                    self.capacity[edge ^ 1] += 1
                path.clear()
                node = source
                continue
            edges = self.edges_of[node]
            while cursor[node] < len(edges):
                edge = edges[cursor[node]]
                head = self.head[edge]
                if (self.capacity[edge] and level[head] == level[node] + 1
                        and self._reduced(node, edge, potential) == 0):
                    break
                cursor[node] += 1
            if cursor[node] < len(edges):
                path.append(edges[cursor[node]])
                node = self.head[edges[cursor[node]]]
            elif node == source:
                return True
            else:  # dead end: never try it again this round, back up one edge
                level[node] = -1
                node = self.head[path.pop() ^ 1]
                cursor[node] += 1


def transitions(old: Mapping[int, Sequence[str]], new: Mapping[int, Sequence[str]]
                ) -> list[Transition]:
    changes = []
    for shard in sorted(set(old) | set(new)):
        before, after = tuple(old.get(shard, ())), tuple(new.get(shard, ()))
        add = tuple(s for s in after if s not in before)
        remove = tuple(s for s in before if s not in after)
        if add or remove:
            changes.append(Transition(shard, add, remove))
    return changes


def loads(placement: Mapping[int, Sequence[str]], sites: Sequence[str]) -> dict[str, int]:
    counts = Counter({site: 0 for site in sites})
    for members in placement.values():
        counts.update(members)
    return dict(counts)


def from_data(shards: Mapping[str, Sequence[str]]) -> Placement:
    return {int(shard): tuple(members) for shard, members in shards.items()}


def as_data(placement: Mapping[int, Sequence[str]]) -> dict[str, list[str]]:
    return {str(shard): list(members) for shard, members in sorted(placement.items())}
