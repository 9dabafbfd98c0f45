"""The seeded Raft simulation (tests/raft/sim.py), short: a few seeds of network, disk and
crash faults with membership changes, learners, snapshots and read-index reads, every
safety property checked as it runs. `make simulate` runs the long version."""

import pytest

from tests.raft.sim import Options, run

SEEDS = range(1, 9)


@pytest.mark.parametrize("seed", SEEDS)
def test_simulation_is_safe_and_live(seed: int) -> None:
    sim = run(seed, Options(steps=30_000))
    checker = sim.checker
    assert checker.acks > 100 and checker.reads > 50
    assert sim.crashes and sim.partitions and sim.changes


def test_a_seed_replays_exactly() -> None:
    first, second = run(7, Options(steps=5000)), run(7, Options(steps=5000))
    assert (first.steps, first.now, first.checker.acks) == (
        second.steps, second.now, second.checker.acks)


def test_snapshots_reach_followers() -> None:
    installs = sum(run(seed, Options(steps=30_000)).checker.installs for seed in (1, 2))
    assert installs > 0
