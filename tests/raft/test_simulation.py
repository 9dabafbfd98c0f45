"""The seeded Raft simulation (tests/raft/sim.py), short: a few seeds of network, disk and
crash faults with membership changes, learners, snapshots and read-index reads, every
safety property checked as it runs. `make simulate` runs the long version."""

import pytest

from tests.raft.sim import Options, Simulation, run

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


def test_installs_off_the_loop_keep_safety() -> None:
    """Every install of a whole snapshot goes on off the loop for a while (a shard builds
    its database on a thread), new replicas get snapshots, storage fails now and then,
    at the end of an install too: messages, commits and crashes meanwhile; every safety
    check holds (the machine applies in order, no entry twice) and snapshots get
    installed."""
    options = Options(steps=30_000, deferred_installs=1.0, snapshot_new_replicas=1.0,
                      chunk_failures=0.2)
    sims = [run(seed, options) for seed in (5, 6)]
    assert sum(sim.checker.installs for sim in sims) > 0
    assert sum(sim.deferred_installs() for sim in sims) > 0


def test_snapshots_that_resume_elsewhere_and_go_to_new_replicas_keep_safety() -> None:
    """Every group snapshots a follower whose log is empty rather than sending it the log,
    and receivers often have a transfer go on from an earlier offset (a shipped file that
    failed its checksum); snapshots still get installed and every safety check holds."""
    options = Options(steps=30_000, chunk_rewinds=0.3, snapshot_new_replicas=1.0)
    sims = [run(seed, options) for seed in (3, 4)]
    assert sum(sim.checker.installs for sim in sims) > 0
    assert sum(sim.chunk_rewinds() for sim in sims) > 0


def test_snapshots_longer_than_the_window_keep_safety() -> None:
    """Snapshots of several windows of chunks: each flush sends what the window has room
    for and each stored chunk is answered in the flush that stored it, while chunks are
    lost, refused, fetched again from an earlier offset and the leader changes; snapshots
    still get installed and every safety check holds."""
    options = Options(steps=30_000, snapshot_chunks=14, chunk_rewinds=0.1,
                      snapshot_new_replicas=1.0, chunk_failures=0.05)
    sims = [run(seed, options) for seed in (7, 8)]
    assert sum(sim.checker.installs for sim in sims) > 0
    assert sum(sim.chunk_rewinds() for sim in sims) > 0


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


def test_dropped_links_and_crashes_that_close_them_keep_safety() -> None:
    """Links dropping often (each end elects at once when its leader's closes) on top of
    every other fault: every safety check holds and the groups stay live."""
    options = Options(steps=30_000, link_drop_every=3.0)
    for seed in (21, 22):
        sim = run(seed, options)
        assert sim.checker.acks > 100 and sim.link_drops > 300


ELECTION_TICKS = 10  # as SimNode configures its hosts
HEARTBEAT_TICKS = 2


def _quiet_cluster(seed: int) -> Simulation:
    """Three nodes, one group, a fault-free network and disk (proposals still flow),
    settled on a leader that has committed."""
    sim = Simulation(seed, Options(nodes=3, groups=1, disk_stalls=0))
    sim.faults = False
    assert sim.run_until(lambda: (leader := sim.leader_of(1)) is not None
                         and leader.host.core(1).commit > 5, 200)
    return sim


def _new_leader_after(sim: Simulation, old: str, ticks: float) -> float | None:
    """Simulated time until a node other than `old` leads, None if none within `ticks`."""
    start = sim.now

    def elsewhere() -> bool:
        leader = sim.leader_of(1)
        return leader is not None and leader.id != old

    return sim.now - start if sim.run_until(elsewhere, ticks) else None


@pytest.mark.parametrize("seed", range(20))
def test_a_killed_leader_is_replaced_well_within_an_election_timeout(seed: int) -> None:
    sim = _quiet_cluster(seed)
    leader = sim.leader_of(1)
    assert leader is not None
    acked = sim.checker.acks
    sim._crash(leader, closes_links=True)
    took = _new_leader_after(sim, leader.id, 4 * ELECTION_TICKS)
    assert took is not None and took < ELECTION_TICKS / 2
    assert sim.run_until(lambda: sim.checker.acks > acked, ELECTION_TICKS)


@pytest.mark.parametrize("seed", range(20))
def test_a_frozen_leader_is_replaced_only_after_an_election_timeout(seed: int) -> None:
    """Frozen (SIGSTOP), its connections stay open: the others hear nothing, which is no
    news before an election timeout (the last heartbeat was at most HEARTBEAT_TICKS and a
    delivery before the freeze)."""
    sim = _quiet_cluster(seed)
    leader = sim.leader_of(1)
    assert leader is not None
    sim._crash(leader, closes_links=False)
    took = _new_leader_after(sim, leader.id, 4 * ELECTION_TICKS)
    assert took is not None and took >= ELECTION_TICKS - HEARTBEAT_TICKS - 1


@pytest.mark.parametrize(("seed", "flapping"), [(seed, flapping) for seed in range(6)
                                                 for flapping in ("first", "second", "each")])
def test_a_flapping_link_to_a_healthy_leader_disrupts_nothing(seed: int, flapping: str) -> None:
    """The link between the leader and one follower (the first survivor by ID, the second,
    or each in turn once the other hears the leader again) drops and comes back over and
    over, the other follower hearing the leader all along: each drop starts a pre-vote on
    the follower, which fails, and none may unseat the leader or raise a term."""
    sim = _quiet_cluster(seed)
    leader = sim.leader_of(1)
    assert leader is not None
    core = leader.host.core(1)
    term = core.term
    followers = sorted(node for node in sim.ids if node != leader.id)
    acked = sim.checker.acks
    for flap in range(60):
        follower = {"first": followers[0], "second": followers[1]}.get(
            flapping, followers[flap % 2])
        sim.drop_link((leader.id, follower), down_for=0.2 + (flap % 7) * 0.4)
        heard = sim.nodes[follower].host.core(1)
        assert sim.run_until(lambda: heard.leader == leader.id and (  # noqa: B023
            leader.id, follower) not in sim.cut, 10)  # noqa: B023
        sim.run_until(lambda: False, 0.3 + (flap % 3) * 0.5)
    assert sim.leader_of(1) is leader and core.term == term
    assert all(node.host.core(1).term == term for node in sim.nodes.values())
    assert sim.checker.acks > acked + 50
