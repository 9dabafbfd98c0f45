"""Smoke test of bench/cluster_bench.py: ours as a 3-node cluster in --quick mode. Its figures
mean something only if the messages really went where the placement says: a cluster that
stopped forwarding, a route that arrived too late, or a bench that quietly put publisher and
subscriber on one node fails here. No timing is asserted: the machine is shared."""

import json
from pathlib import Path
from typing import Any

from bench import cluster_bench


def test_quick_run_on_three_nodes_delivers_every_message_where_it_was_placed(
        tmp_path: Path) -> None:
    output = tmp_path / "cluster_results.json"
    assert cluster_bench.main(["--quick", "--brokers", "ours", "--nodes", "3",
                               "--output", str(output)]) == 0
    data = json.loads(output.read_text())
    assert data["environment"]["cluster_sizes"] == {"ours": [3]}
    result = data["results"]["ours3"]
    assert "errors" not in result, result.get("errors")
    assert (result["broker"], result["nodes"]) == ("ours", 3)

    same, cross, both = result["same"], result["cross"], result["both"]
    for cell in (same, cross, both):
        assert cell["published"] > 0 and cell["verified"], cell
        assert cell["lost"] == cell["duplicates"] == cell["unacked_by_broker"] == 0
        assert len(cell["cpu_us_per_msg"]) == len(cell["node_cpu"]) == 3
    p = same["published"]
    assert same["delivered_per_node"] == [p, 0, 0] and same["forwarded"] == 0
    p = cross["published"]
    assert cross["delivered_per_node"] == [0, p, 0]  # all of it from node 1, through node 2
    assert cross["forwarded"] == p  # each message crossed once, counted by the sender
    p = both["published"]
    assert both["delivered_per_node"] == [p, p, 0] and both["forwarded"] == p

    fanout = result["fanout"]
    assert fanout["published"] > 0
    assert all(n > 0 for n in fanout["delivered_per_node"])  # subscribers on every node
    assert fanout["forwarded"] == 2 * fanout["published"]  # once per other node, not per sub

    for derived in ("cross_over_same", "forward_us", "hop_us"):
        assert isinstance(result[derived], int | float)
    assert data["ratios"] == {}  # no RabbitMQ in this run
    assert "ours x3" in cluster_bench.table(data["results"])


def _cell(rate: int, node0_us: float, total_us: float) -> dict[str, Any]:
    return {"msgs_per_s": rate, "verified": True, "cpu_us_per_msg": [node0_us, 1.0, 0.0],
            "cluster_cpu_us_per_msg": total_us, "other_cpu": 0.0}


def test_derived_figures_come_from_rounds_run_side_by_side() -> None:
    """cross/same is the median of each pair's ratio, forwarding the publisher node's CPU in
    `both` minus `same`, the hop all nodes' CPU in `cross` minus `same`; a failed round drops
    its pair from the derived figures instead of skewing them."""
    summary = cluster_bench.summarize({
        "same": [_cell(100, 6.0, 6.5), _cell(50, 8.0, 8.5), _cell(90, 6.0, 6.5)],
        "cross": [_cell(80, 4.0, 9.0), _cell(40, 5.0, 11.0), {"error": "gone"}],
        "both": [_cell(60, 9.0, 14.0), _cell(30, 12.0, 17.0), _cell(55, 9.5, 14.5)],
        "fanout": [_cell(10, 30.0, 90.0)],
    })
    assert summary["cross_over_same_pairs"] == [0.8, 0.8]
    assert summary["forward_us_pairs"] == [3.0, 4.0]
    assert summary["forward_us"] == 3.0  # the lower middle of an even count: a measured one
    assert summary["hop_us_pairs"] == [2.5, 2.5]
    assert summary["same"]["msgs_per_s"] == 90  # the median round, whole
    assert summary["same"]["rounds_msgs_per_s"] == [100, 50, 90]
    assert summary["cross"]["rounds_msgs_per_s"] == [80, 40]
    assert summary["errors"] == ["gone"]
