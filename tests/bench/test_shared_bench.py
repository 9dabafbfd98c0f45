"""Smoke test of bench/shared_bench.py at a tiny size (16 publishers, one per shard, and 4
workers; 1 s windows): its figures mean something only if every acknowledged message reached
exactly one worker of the group (or the single subscriber), counted by identity, on one node
and on 3 nodes at RF 3, and if the PUBACK times and the workers' spread come from the round.
No timing is asserted: the machine is shared."""

import json
from pathlib import Path
from typing import Any

import pytest

from bench import brokers, shared_bench, wire

PUBLISHERS, WORKERS = 16, 4


def _run(tmp_path: Path, configs: list[str]) -> dict[str, Any]:
    output = tmp_path / "shared_results.json"
    assert shared_bench.main(["--quick", "--configs", ",".join(configs), "--publishers",
                              str(PUBLISHERS), "--output", str(output)]) == 0
    data: dict[str, Any] = json.loads(output.read_text())
    assert list(data["environment"]["configs"]) == configs
    assert data["environment"]["publishers"] == PUBLISHERS
    return data


def _check_every_message_delivered(result: dict[str, Any], kinds: list[str],
                                   nodes: int) -> None:
    assert "errors" not in result, result.get("errors")
    assert result["nodes"] == nodes
    for kind in kinds:
        [cell] = result[f"{kind}_rounds"]
        assert result[kind]["msgs_per_s"] == cell["msgs_per_s"] > 0
        assert cell["verified"], cell
        assert cell["published"] > 0 and cell["unacked_by_broker"] == 0
        assert cell["unique"] == cell["published"] == sum(cell["worker_deliveries"])
        assert cell["lost"] == cell["duplicates"] == cell["cross_worker_duplicates"] == 0
        assert cell["sentinels_received"] >= len({n % nodes for n in range(PUBLISHERS)})
        assert len(cell["node_cpu"]) == nodes
        assert cell["puback_samples"] > 0
        assert 0 < cell["puback_p50_ms"] <= cell["puback_p99_ms"] <= cell["puback_max_ms"]
        workers = WORKERS if kind != "single" else 1
        assert len(cell["worker_deliveries"]) == workers
        assert cell["worker_nodes"] == [n % nodes + 1 for n in range(workers)]
        if kind == "single":
            assert cell["spread"] is None and cell["split_publishers"] == 0
        else:
            assert cell["spread"] >= 1.0
            assert all(cell["worker_deliveries"]), cell["worker_deliveries"]


def test_one_node_delivers_every_message_in_every_kind(tmp_path: Path) -> None:
    configs = ["mosquitto", "ours1"] if brokers.MOSQUITTO_BIN.exists() else ["ours1"]
    data = _run(tmp_path, configs)
    results = data["results"]
    _check_every_message_delivered(results["ours1"], ["group", "single", "memory"], 1)
    assert isinstance(data["ratios"]["ours1.group/ours1.single"]["median"], float)
    if "mosquitto" in results:
        _check_every_message_delivered(results["mosquitto"], ["memory"], 1)
        assert "group_rounds" not in results["mosquitto"]
        assert data["ratios"]["ours1.group/mosquitto.memory"]["target"] == 0.5
    assert "ours x1 builtin_local: durable group" in shared_bench.table(results,
                                                                       data["ratios"])


def test_three_nodes_at_rf_3_deliver_every_message_in_every_kind(tmp_path: Path) -> None:
    data = _run(tmp_path, ["ours3"])
    _check_every_message_delivered(data["results"]["ours3"], ["group", "single", "memory"], 3)
    ratio = data["ratios"]["ours3.group/ours3.single"]
    assert ratio["target"] == shared_bench.TARGET_SINGLE and isinstance(ratio["met"], bool)


def _records(*workers: list[tuple[int, int]]) -> list[bytes]:
    return [b"".join(wire.IDENTITY.pack(*identity) for identity in worker)
            for worker in workers]


def test_tally_counts_by_identity_not_by_totals() -> None:
    """One message lost and another delivered twice add up to the right total: counted by
    identity, both show. Settling messages are counted apart."""
    counted = shared_bench.tally(_records(
        [(0, 0), (0, 1), (1, 0), (shared_bench.SENTINEL, 0)],
        [(1, 2), (1, 1), (0, 1)],  # (1, 1) after (1, 2); (0, 1) a second time
    ), published=6)  # (0, 2) was acknowledged and never received
    assert counted["worker_deliveries"] == [3, 3]
    assert counted["unique"] == 5 and counted["lost"] == 1
    assert counted["duplicates"] == counted["cross_worker_duplicates"] == 1
    assert counted["reordered"] == 1
    assert counted["split_publishers"] == 2
    assert counted["sentinels_received"] == 1


def test_publisher_ids_hold_each_shard_evenly() -> None:
    ids = shared_bench.balanced_ids("x", 100, 16)
    assert len(set(ids)) == 100
    per_shard = [0] * 16
    for client_id in ids:
        per_shard[shared_bench.shard_of(client_id, 16)] += 1
    assert sorted(per_shard) == [6] * 12 + [7] * 4


@pytest.mark.parametrize(("group", "single", "met"), [(900, 1000, True), (700, 1000, False)])
def test_ratios_pair_rounds_and_judge_the_target(group: int, single: int, met: bool) -> None:
    results = {"ours1": {"group_rounds": [{"msgs_per_s": group}, {"error": "gone"}],
                         "single_rounds": [{"msgs_per_s": single}, {"msgs_per_s": single}]}}
    ratios = shared_bench.ratios(results)
    assert list(ratios) == ["ours1.group/ours1.single"]
    assert ratios["ours1.group/ours1.single"] == {
        "pairs": [group / single], "median": group / single,
        "target": shared_bench.TARGET_SINGLE, "met": met}
