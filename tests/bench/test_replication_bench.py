"""Smoke test of bench/replication_bench.py: ours as one node and as 3 nodes with
`builtin_raft` in --quick mode. Its figures mean something only if the replicated cluster
acknowledged and delivered every message, the probe measured acknowledgements, the failover
round saw a new leader, and the new replica really holds what it caught up (a session drained
from it). No timing is asserted: the machine is shared."""

import json
from pathlib import Path
from typing import Any

from bench import replication_bench

MESSAGES = 2_000


def test_quick_run_verifies_throughput_failover_and_catch_up(tmp_path: Path) -> None:
    output = tmp_path / "replication_results.json"
    assert replication_bench.main(["--quick", "--brokers", "ours", "--output", str(output),
                                   "--catch-up-messages", str(MESSAGES)]) == 0
    data = json.loads(output.read_text())
    assert data["environment"]["configs"].keys() == {"ours1", "ours3"}
    [run] = data["runs"]
    results = run["results"]
    for key in ("ours1", "ours3"):
        assert "errors" not in results[key], results[key].get("errors")
        for pl in replication_bench.PLACEMENTS:
            cell = results[key][pl.key]
            assert cell["published"] > 0 and cell["verified"], cell
            assert cell["lost"] == cell["duplicates"] == cell["unacked_by_broker"] == 0
            assert cell["puback_samples"] > 0
            assert 0 < cell["puback_p50_ms"] <= cell["puback_p99_ms"] <= cell["puback_max_ms"]
    for pl in replication_bench.PLACEMENTS:
        assert isinstance(results["ours3"][pl.key]["sessions_leader_on_node1"], bool)
        # every node of RF 3 wrote log entries, each fsync at least one
        per_node = results["ours3"][pl.key]["wal_entries_per_fsync"]
        assert len(per_node) == 3 and all(n is not None and n >= 1 for n in per_node), per_node
    # 1 -> 1's publisher writes to its shard's leader, as on one node (no forwarding)
    assert results["ours3"]["1to1"]["publisher_shard_led_on_node1"] is True
    assert isinstance(run["ratios"]["ours3/ours1"]["1to1.msgs_per_s"], float)

    [kill] = results["ours3"]["failover"]["kills"]
    assert kill["failover_s"] > 0
    assert kill["new_leader"] not in (None, kill["killed"])

    variants = [variant for variant, _ in replication_bench.CATCH_UP_VARIANTS]
    assert [c["variant"] for c in run["catch_up"]] == variants  # log, snapshot, files
    for cu in run["catch_up"]:
        assert "error" not in cu, cu
        assert cu["published"] == MESSAGES
        assert cu["drain_delivered"] == MESSAGES and cu["drain_sessions_present"] == 1, cu
        assert cu["replica_data_mib"] > 0 and cu["copy_s"] > 0
        assert 0 < cu["up_s"] <= cu["caught_up_s"] and cu["transfer_s"] >= 0
        assert cu["joined_s"] > 0 and cu["from_join_s"] >= cu["transfer_s"]
        assert cu["groups"] == 2 + replication_bench.N_SHARDS  # it hosts every group
    assert run["catch_up"][1]["snapshot_indexes"] > 0  # its logs were compacted
    assert "ours3/ours1" in replication_bench.table(run)


def _cell(rate: int, p99: float) -> dict[str, Any]:
    return {"msgs_per_s": rate, "puback_p50_ms": 1.0, "puback_p99_ms": p99, "verified": True}


def test_table_puts_ratios_side_by_side_and_names_failures() -> None:
    run = {"results": {
        "ours1": {"config": "one", "1to1": _cell(1000, 4.0), "100to1": _cell(800, 8.0)},
        "ours3": {"config": "three", "1to1": _cell(600, 10.0),
                  "errors": ["100to1: RuntimeError: gone"]},
    }}
    lines = replication_bench.table(run).splitlines()
    rate = next(line for line in lines if line.startswith("durable QoS 1, 1 -> 1: msgs/s"))
    assert rate.split()[-3:] == ["0.60x", ">=", f"{replication_bench.TARGET}x"]
    p99 = next(line for line in lines if "1 -> 1: PUBACK p99" in line)
    assert p99.split()[-1] == "2.50x"
    fan_in = next(line for line in lines if line.startswith("durable QoS 1, 100 -> 1: msgs/s"))
    assert fan_in.split()[-4:] == ["FAILED", "-", ">=", f"{replication_bench.TARGET}x"]
    assert "FAILED ours3: 100to1: RuntimeError: gone" in lines


def test_percentile_is_a_measured_value() -> None:
    values = [float(v) for v in range(1, 101)]
    assert replication_bench.percentile(values, 50) == 50.0
    assert replication_bench.percentile(values, 99) == 99.0
    assert replication_bench.percentile(values, 100) == 100.0
    assert replication_bench.percentile([3.0], 99) == 3.0


def test_rounds_drive_from_a_node_that_leads_a_shard(monkeypatch: Any) -> None:
    """Elections may leave node 1 leading no shard (CI saw it once): the round then drives
    from a node that leads one instead of failing, and says what each node saw."""
    class Member:
        name = "ours"

        def __init__(self, node: str) -> None:
            self.node = node

    members: list[Any] = [Member("n1"), Member("n2"), Member("n3")]
    groups = [{"name": f"messages shard {i}", "leader": "s3" if i % 2 else "s2"}
              for i in range(replication_bench.N_SHARDS)]
    sites = {"n1": "s1", "n2": "s2", "n3": "s3"}
    monkeypatch.setattr(replication_bench, "raft_status",
                        lambda m: {"site": sites[m.node], "groups": groups})
    assert [m.node for m in replication_bench.driving_first(members)] == ["n2", "n1", "n3"]
    groups[0]["leader"] = "s1"
    assert replication_bench.driving_first(members) == members
