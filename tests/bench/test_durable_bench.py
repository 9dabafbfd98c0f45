"""Smoke test of bench/durable_bench.py at a tiny scale: the benchmark's figures are only
worth something if its counts are right, and this is where a broken generator, a broker that
loses or duplicates queued messages, or a Mosquitto configured so that it cannot keep its
queue across a restart shows up without a full run."""

import pytest

from bench import brokers, durable_bench

SESSIONS, MESSAGES = 40, 50


@pytest.mark.parametrize("name", durable_bench.ALL_BROKERS)
def test_queue_drain_and_restart_counts_add_up(name: str) -> None:
    if name == "mosquitto" and not brokers.MOSQUITTO_BIN.exists():
        pytest.skip("Debian's mosquitto is not installed")
    queued = durable_bench.queue_round(name, SESSIONS, MESSAGES)
    assert queued["published"] == MESSAGES
    assert queued["delivered"] == SESSIONS * MESSAGES
    assert queued["sessions_present"] == SESSIONS
    assert queued["sessions_not_exact"] == 0
    restarted = durable_bench.restart_round(name, SESSIONS, MESSAGES)
    assert restarted["after_restart_delivered"] == SESSIONS * MESSAGES
    assert restarted["after_restart_sessions_present"] == SESSIONS
    assert restarted["after_restart_sessions_not_exact"] == 0
    assert ("kill9_restart_s" in restarted) == (name == "ours")
    assert "*" not in durable_bench.table([name], {name: {**queued, **restarted}})


def _round(rate: int, verified: bool = True, other: float = 0.0) -> dict[str, object]:
    return {"throughput_msgs_per_s": rate, "throughput_verified": verified,
            "throughput_broker_cpu": rate / 100_000, "throughput_other_cpu": other}


def test_throughput_pairs_report_the_median_round_and_the_median_pair_ratio() -> None:
    """Rounds alternate brokers; each broker's figure is its median round, whole (its CPU
    figures belong to that rate), and the ratio is the median of the pairs' ratios, not the
    ratio of the medians (which would compare rounds run at different moments)."""
    summary = durable_bench.summarize_throughput({
        "ours": [_round(40_000), _round(20_000), _round(45_000)],
        "mosquitto": [_round(80_000), _round(50_000), _round(60_000, verified=False)],
    })
    ours, peer = summary["ours"], summary["mosquitto"]
    assert ours["throughput_msgs_per_s"] == 40_000
    assert ours["throughput_broker_cpu"] == 0.4
    assert ours["throughput_rounds"] == [40_000, 20_000, 45_000]
    assert ours["throughput_verified"] is True
    assert peer["throughput_msgs_per_s"] == 60_000
    assert peer["throughput_verified"] is False  # one round did not add up
    assert ours["throughput_pair_ratios"] == [0.5, 0.4, 0.75]
    assert ours["throughput_median_pair_ratio"] == 0.5
    row = next(line for line in durable_bench.table(["ours", "mosquitto"], summary).splitlines()
               if line.startswith("durable QoS 1"))
    assert "0.500x" in row and "0.667x" not in row
    assert ours["throughput_noisy_pairs"] == []
    assert "warning" not in durable_bench.table(["ours", "mosquitto"], summary)


def test_pairs_the_machine_disturbed_are_named() -> None:
    summary = durable_bench.summarize_throughput({
        "ours": [_round(40_000), _round(20_000, other=0.7)],
        "mosquitto": [_round(80_000, other=0.3), _round(50_000)],
    })
    assert summary["ours"]["throughput_noisy_pairs"] == [1, 2]
    assert "pairs [1, 2]" in durable_bench.table(["ours", "mosquitto"], summary)


def test_a_failed_throughput_round_is_reported_not_averaged_away() -> None:
    summary = durable_bench.summarize_throughput({
        "ours": [_round(40_000), {"throughput_error": "BrokerUnavailable: gone"}],
    })
    assert summary["ours"] == {"throughput_error": "BrokerUnavailable: gone"}
