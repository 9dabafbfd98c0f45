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


def test_snapshots_reach_followers_whose_storage_fails_now_and_then() -> None:
    """A chunk whose storage fails (a full disk) is not acknowledged, the transfer starts
    over, and snapshots still get installed; every safety check holds."""
    sims = [run(seed, Options(steps=30_000, chunk_failures=0.3)) for seed in (1, 2)]
    assert sum(sim.checker.installs for sim in sims) > 0
    assert sum(sim.chunk_failures() for sim in sims) > 0


def test_leadership_transfers_under_faults_keep_safety() -> None:
    """Frequent transfers, a crash of the leader or the target in half of them, proposals
    all along: every safety check holds, transfers happen and some are given up."""
    options = Options(steps=30_000, transfer_every=5.0, crash_in_transfer=0.5)
    done = aborted = 0
    for seed in (11, 12):
        sim = run(seed, options)
        assert sim.checker.acks > 100
        done += sim.transfers_done()
        aborted += sim.transfers_aborted()
    assert done > 10 and aborted > 0
