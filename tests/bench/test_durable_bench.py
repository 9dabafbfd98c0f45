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
