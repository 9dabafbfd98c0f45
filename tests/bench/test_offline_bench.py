"""Smoke test of bench/offline_bench.py at a tiny scale: its per-session figures are only
worth something if every session was created, went offline and came back."""

from bench import offline_bench

SESSIONS = 200


def test_every_session_is_created_offloaded_and_resumed() -> None:
    cell = offline_bench.run("ours", SESSIONS, offline_bench.TOPICS["own"], 50)
    assert cell["create"]["acknowledged"] == SESSIONS
    assert cell["storm"]["present"] == SESSIONS and cell["storm"]["refused"] == 0
    assert cell["verified"]
    assert cell["base_rss_anon_kib"] > 0 and isinstance(cell["rss_anon_bytes_per_session"], int)
