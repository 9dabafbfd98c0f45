"""Smoke test of bench/startup_bench.py at a tiny scale: a restart time is only worth
something if the broker that answered the CONNACK still held the queue it was timed with."""

import pytest

from bench import brokers, startup_bench


@pytest.mark.parametrize("name", startup_bench.ALL_BROKERS)
def test_restarts_keep_the_queue_they_are_timed_with(name: str) -> None:
    if name == "mosquitto" and not brokers.MOSQUITTO_BIN.exists():
        pytest.skip("Debian's mosquitto is not installed")
    restarted = startup_bench.restarts(name, 20, 30, 2)
    assert restarted["published"] == 30 and restarted["queued"] == 600
    assert restarted["one_session_kept"] == 30  # the last of the restarts kept it all
    assert len(restarted["restart_s"]) == len(restarted["restart_cpu_s"]) == 2
    assert all(seconds > 0 for seconds in restarted["restart_s"])


def test_empty_starts_are_timed_for_each_broker_in_turn() -> None:
    started = startup_bench.empty_starts(["ours"], 2)
    assert len(started["ours"]["s"]) == len(started["ours"]["cpu_s"]) == 2
    assert all(cpu > 0 for cpu in started["ours"]["cpu_s"])  # a Python process did work
