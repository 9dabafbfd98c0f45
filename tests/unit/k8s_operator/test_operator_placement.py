"""Placement properties over random clusters and random scale steps (hypothesis)."""

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from mqtt_operator.placement import Placement, loads, plan, transitions

SITES = [f"S{index:02d}" for index in range(9)]


def assert_valid(placement: Placement, sites: Sequence[str], n_shards: int, rf: int) -> None:
    assert sorted(placement) == list(range(n_shards))
    for members in placement.values():
        assert len(members) == min(rf, len(sites))
        assert len(set(members)) == len(members)
        assert set(members) <= set(sites)
    counts = loads(placement, sites).values()
    assert max(counts) - min(counts) <= 1


def fewest_additions(previous: Placement, sites: Sequence[str], width: int) -> int:
    """The true optimum, by min-cost flow: shard -> site edges cost 1 unless the shard already
    has a replica there; each site takes `share` replicas, `extra` of them one more."""
    shards = sorted(previous)
    share, extra = divmod(width * len(shards), len(sites))
    source, hub, sink = 0, 1, 2
    shard_node = {shard: 3 + i for i, shard in enumerate(shards)}
    site_node = {site: 3 + len(shards) + i for i, site in enumerate(sites)}
    graph: list[list[int]] = [[] for _ in range(3 + len(shards) + len(sites))]
    edges: list[list[int]] = []  # [to, capacity, cost]; edge i^1 is the reverse of edge i

    def edge(a: int, b: int, capacity: int, cost: int) -> None:
        graph[a].append(len(edges))
        edges.append([b, capacity, cost])
        graph[b].append(len(edges))
        edges.append([a, 0, -cost])

    for shard in shards:
        edge(source, shard_node[shard], width, 0)
        for site in sites:
            edge(shard_node[shard], site_node[site], 1, 0 if site in previous[shard] else 1)
    for site in sites:
        edge(site_node[site], sink, share, 0)
        edge(site_node[site], hub, 1, 0)
    edge(hub, sink, extra, 0)
    total = 0
    while True:  # successive shortest paths (Bellman-Ford: residual costs go negative)
        distance = [None] * len(graph)
        via: list[int | None] = [None] * len(graph)
        distance[source] = 0
        changed = True
        while changed:
            changed = False
            for node, here in enumerate(distance):
                if here is None:
                    continue
                for index in graph[node]:
                    to, capacity, cost = edges[index]
                    if capacity and (distance[to] is None or here + cost < distance[to]):
                        distance[to], via[to], changed = here + cost, index, True
        if distance[sink] is None:
            return total
        node = sink
        while node != source:
            index = via[node]
            edges[index][1] -= 1
            edges[index ^ 1][1] += 1
            node = edges[index ^ 1][0]
        total += distance[sink]


def added(old: Placement, new: Placement) -> int:
    return sum(len(t.add) for t in transitions(old, new))


clusters = st.tuples(
    st.integers(1, 24),  # n_shards
    st.integers(1, 5),  # replication factor
    st.lists(st.integers(1, len(SITES)), min_size=1, max_size=5),  # successive sizes
)


@settings(max_examples=300, deadline=None)
@given(clusters)
def test_every_plan_is_valid_balanced_and_moves_the_fewest_replicas(
        case: tuple[int, int, list[int]]) -> None:
    n_shards, rf, sizes = case
    current: Placement = {}
    for size in sizes:
        sites = SITES[:size]
        new = plan(current, sites, n_shards, rf)
        assert_valid(new, sites, n_shards, rf)
        if current and min(rf, size) >= max(len(m) for m in current.values()):
            assert added(current, new) == fewest_additions(current, sites, min(rf, size))
        assert plan(current, sites, n_shards, rf) == new  # deterministic
        assert plan(new, sites, n_shards, rf) == new  # a plan is its own fixed point
        current = new


def test_scale_up_moves_only_what_the_new_sites_need() -> None:
    three = plan({}, SITES[:3], 16, 3)
    five = plan(three, SITES[:5], 16, 3)
    assert loads(five, SITES[:5]) in ({"S00": 10, "S01": 10, "S02": 10, "S03": 9, "S04": 9},
                                     {**dict.fromkeys(SITES[:5], 10), "S00": 9, "S01": 9})
    moved = transitions(three, five)
    assert all(set(t.add) <= {"S03", "S04"} and not set(t.remove) & {"S03", "S04"}
               for t in moved)
    assert sum(len(t.add) for t in moved) == 48 - 30


def test_scale_down_moves_only_replicas_of_leaving_sites() -> None:
    five = plan({}, SITES[:5], 16, 2)
    two = plan(five, SITES[:2], 16, 2)
    for change in transitions(five, two):
        assert set(change.remove) <= {"S02", "S03", "S04"}
    assert all(members == ("S00", "S01") for members in two.values())


def test_no_sites_no_plan() -> None:
    assert plan({0: ("S00",)}, [], 4, 3) == {}
