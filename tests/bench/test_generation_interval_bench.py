"""Smoke test of bench/generation_interval_bench.py's storage half at a tiny scale: its seal
and loop figures are only worth something if every minute was stored and sealed, and every
replicated rotation applied."""

from pathlib import Path

from bench import generation_interval_bench as bench


def test_every_minute_is_stored_and_sealed(tmp_path: Path) -> None:
    written = bench.write_hour(tmp_path, 600, True, range(3))
    assert written["seals"] == 3
    assert 0 <= written["loop_longest_stall_in_seals_ms"] <= written["loop_longest_stall_ms"]
    on_disk = bench.on_disk(tmp_path)
    assert on_disk["generations"] == 3 * 4  # each minute sealed on every shard
    assert not list(tmp_path.glob("ds/messages/shard-*/gen-*.tmp"))


def test_each_shard_applies_each_replicated_rotation(tmp_path: Path) -> None:
    rotated = bench.replicated_rotations(tmp_path, 600, 2)
    assert rotated["rotations"] == 2 * 4
    assert 0 < rotated["apply_rotate_median_ms"] <= rotated["apply_rotate_max_ms"]
    assert bench.on_disk(tmp_path)["generations"] == 2 * 4
