"""Smoke test of bench/shared_scale.py at a tiny size (200 sessions, 20 of them held
connected, 100 probe messages a window): every window of every scenario reports its
figures, every probe message arrived, the jobs were acknowledged, and the API saw the
groups that were built. No timing is asserted: the machine is shared."""

import json
from pathlib import Path

from bench import loopwatch, shared_scale

MEMBERS, CONNECTED, PROBES, JOBS = 200, 20, 100, 50
GROUPS = {"baseline": 0, "one_group": 1, "many_groups": MEMBERS}


def test_quick_run_reports_every_window_of_every_scenario(tmp_path: Path) -> None:
    output = tmp_path / "shared_scale_results.json"
    assert shared_scale.main(["--quick", "--watch-loop", "--output", str(output)]) == 0
    data = json.loads(output.read_text())
    assert data["environment"]["sizes"]["members"] == MEMBERS
    assert list(data["scenarios"]) == list(GROUPS)
    for key, scenario in data["scenarios"].items():
        assert "error" not in scenario, scenario.get("error")
        assert scenario["build"]["clients"] == MEMBERS and scenario["build"]["failed"] == 0
        assert scenario["hold"]["clients"] == CONNECTED and scenario["hold"]["failed"] == 0
        assert list(scenario["windows"]) == [v.key for v in shared_scale.VARIANTS]
        for variant, cell in scenario["windows"].items():
            where = f"{key} / {variant}"
            assert cell["probe_sent"] == cell["probe_delivered"] == PROBES, where
            assert cell["probe_undelivered"] == 0, where
            assert 0 < cell["probe_p50_ms"] <= cell["probe_p99_ms"] <= cell["probe_max_ms"]
            assert len(cell["probe_worst"]) == shared_scale.SPIKES
            assert isinstance(cell["p99_under_target"], bool)
            assert cell["jobs_sent"] == cell["jobs_acked"] == JOBS, where
            assert cell["links_dropped"] == 0, cell["first_drop"]
            assert cell["metrics_requests"] >= 1 and cell["api_requests"] >= 1, where
            assert cell["http_errors"] == []
            assert cell["api_groups"] == GROUPS[key], where
            assert cell["api_members"] == (MEMBERS if GROUPS[key] else 0), where
            if GROUPS[key] and variant.startswith("connected"):
                assert cell["api_connected"] >= CONNECTED, where
            if variant.endswith("churn"):
                assert cell["churn_visits"] > 0 and cell["churn_failures"] == 0, where
            assert cell["rss_mib"] > 0 and "loop_stall_sites" in cell
    assert isinstance(data["verdict"]["p99_under_target"], bool)
    assert "many_groups / connected_churn" in shared_scale.table(data["scenarios"])


def test_probe_figures_count_by_number_and_name_what_was_in_flight() -> None:
    """Latency is per message, from its write to its first delivery; a message never
    delivered counts as undelivered, one delivered twice as a duplicate; the worst say
    which scrape was running when they were sent."""
    sent = [10.0, 10.005, 10.010, 10.015]
    result = {"sent": sent, "acked": [10.001, 10.006],
              "delivered": [(0, 10.001), (2, 10.090), (1, 10.007), (2, 10.1)]}
    figures = shared_scale.probe_figures(result, [("api", 10.009, 10.2), ("metrics", 9, 9.5)])
    assert figures["probe_sent"] == 4 and figures["probe_delivered"] == 3
    assert figures["probe_undelivered"] == 1 and figures["probe_duplicates"] == 1
    assert figures["probe_max_ms"] == 80.0 and figures["probe_over_target"] == 1
    assert figures["probe_worst"][0] == {"at_s": 0.01, "ms": 80.0, "during": ["api"]}
    assert figures["probe_puback_max_ms"] == 1.0


def test_loopwatch_times_passes_of_the_loop_and_places_them_in_broker_code(
        tmp_path: Path) -> None:
    """A pass is the time between leaving the selector and entering it again; a long one is
    put down to the innermost frame of the broker's own code in its most frequent stack."""
    watch = loopwatch.Watch(tmp_path / "stalls.jsonl")
    select = watch.wrap(lambda selector, timeout=None: [])
    select(None, 0)
    watch.left -= 0.2  # the pass after it took 200 ms
    left = watch.left
    select(None, 0)
    [(began, seconds, _)] = watch.long
    assert began == left and seconds >= 0.2
    stack = ["json/encoder.py:1 iterencode", "broker/http/api.py:2 list", "broker/node.py:3 x"]
    assert loopwatch.site({"stacks": [[3, stack], [1, ["broker/z.py:1 y"]]]}) == stack[1]
    assert loopwatch.site({"stacks": [[1, ["asyncio/events.py:80 _run"]]]}).startswith("(no")
    assert loopwatch.site({"stacks": []}) == "(not sampled)"
