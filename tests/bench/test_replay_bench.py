"""Smoke test of bench/replay_bench.py at a tiny scale: its ratio is only worth something
if both reads took exactly the stored messages."""

import pytest

from bench import replay_bench

MESSAGES = 300


@pytest.mark.parametrize("replay_first", [True, False])
def test_replay_and_drain_take_the_same_stored_messages(replay_first: bool) -> None:
    cell = replay_bench.replay_round(MESSAGES, replay_first)
    assert cell["published"] == MESSAGES
    assert cell["replay_delivered"] == cell["delivered"] == MESSAGES
    assert cell["replay_verified"] and cell["drain_verified"]
    assert cell["replay_over_drain"] > 0
