"""Smoke test of bench/raft_bench.py, ours only, in --quick mode: three real processes per
group count, linked by the cluster service, commit under load, and after the kill -9 of the
busiest leader a survivor commits as the new leader of each group it led. The figures are
only worth something if that whole path works; their values are not checked (the machine is
shared)."""

import json
from pathlib import Path

from bench import raft_bench


def test_quick_run_commits_and_recovers_from_a_leader_kill(tmp_path: Path) -> None:
    output = tmp_path / "raft_results.json"
    assert raft_bench.main(["--quick", "--systems", "ours", "--output", str(output)]) == 0
    results = json.loads(output.read_text())
    assert results["environment"]["versions"].keys() == {"ours"}
    assert results["ratios"] == {}
    cells = results["results"]["ours"]
    assert cells.keys() == {"1", "16"}
    for groups, cell in cells.items():
        assert cell["ok"], cell.get("error")
        assert cell["commits"] > 0
        assert cell["commits_per_s"] > 0
        assert 0 < cell["latency_p50_ms"] <= cell["latency_p99_ms"]
        # (Leaders counted at one instant: a group may be between two of them.)
        assert len(cell["leaders_per_process"]) == 3
        assert 1 <= sum(cell["leaders_per_process"]) <= 2 * int(groups)
        assert cell["entries_per_fsync"] >= 1
        assert {"cpu", "cpu_us_per_commit", "other_cpu"} <= cell.keys()
        # Every group the killed process led committed again on a new leader.
        assert cell["killed_leader_of"] == len(cell["election_per_group_s"]) >= 1
        assert cell["election_s"] > 0
