"""One Raft process of bench/raft_bench.py: three of them on loopback make a cluster.

    python bench/raft_worker.py {ours|pysyncobj} --index I --ports P,... --groups N
                                --window W --size B --dir D [--batch]

The orchestrator drives it with one command a line on stdin and reads one JSON object a line
on stdout (logs go to stderr): first {"ready": ...} once every group has a leader, then a
reply to each of `go` (start the load), `sample` (counters now), `report T0 T1` (the commits
of that window) and `first T G,G,...` (each group's first commit at or after T); it exits
at the end of its stdin.
Times are time.monotonic(), one clock for every process of the machine, so the
orchestrator's kill time and a worker's commit times compare directly.

The load: each group this process leads keeps `window` proposals of `size` bytes
outstanding, as an MQTT publisher keeps its in-flight window full; each is timed from the
proposal to the leader seeing it committed (ours: applied once a majority has it fsync'd;
pysyncobj: its callback). Only leaders propose, so no commit is a request forwarded between
processes, and a new leader starts proposing the moment it is elected.

This file runs under two interpreters: the project venv for `ours`, bench/.venv-pysyncobj
(which has neither the broker nor its dependencies) for `pysyncobj`; so each system's
imports are inside its own function.
"""

import argparse
import asyncio
import json
import logging
import sys
import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

SITES = ("n0", "n1", "n2")
COOKIE = "raft-bench"

Sample = Callable[[], dict[str, Any]]


class Commits:
    """One group's commits as its leader saw them: commit times (non-decreasing, so a window
    is two bisections) and latencies. Appended by the one thread that drives the group."""

    __slots__ = ("latencies", "times")

    def __init__(self) -> None:
        self.times = array("d")
        self.latencies = array("d")

    def add(self, proposed: float) -> None:
        now = time.monotonic()
        self.times.append(now)
        self.latencies.append(now - proposed)


def answer(words: list[str], commits: dict[int, Commits], sample: Sample) -> dict[str, Any]:
    """The reply to one orchestrator command (all but `go`)."""
    if words[0] == "sample":
        return {"t": time.monotonic(), **sample()}
    if words[0] == "report":
        start, end = float(words[1]), float(words[2])
        latencies: list[float] = []
        for group in commits.values():
            latencies.extend(group.latencies[bisect_left(group.times, start):
                                             bisect_left(group.times, end)])
        return {"commits": len(latencies), "latencies_us": [round(x * 1e6) for x in latencies]}
    if words[0] == "first":
        after = float(words[1])
        first: dict[str, float | None] = {}
        for group in map(int, words[2].split(",")):
            times = commits[group].times
            position = bisect_left(times, after)
            first[str(group)] = times[position] if position < len(times) else None
        return {"first": first}
    return {"error": f"unknown command {words[0]!r}"}


def reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------------- ours

async def ours(args: argparse.Namespace) -> None:
    from broker.cluster.frames import Channel
    from broker.cluster.service import Cluster
    from broker.config.loader import load_config
    from broker.raft.core import LEADER, NotLeader
    from broker.raft.messages import NORMAL, Entry
    from broker.raft.node import CommandLost, RaftNode
    from broker.raft.ready import SnapshotChunk
    from broker.server.app import _tune_collector

    class Links:
        """RaftNode's transport: the cluster's links, channel RAFT. What is sent while a
        link is down is dropped; Raft sends it again."""

        def send(self, peer: str, data: bytes) -> None:
            cluster.send(peer, Channel.RAFT, data)

        def flush(self) -> None:
            cluster.flush()

    class Counter:
        """The trivial state machine: counts commands, in memory; its snapshot is the
        count, in one chunk."""

        def __init__(self) -> None:
            self.count = 0
            self.index = 0

        def apply(self, entry: Entry) -> None:
            self.index = entry.index
            if entry.kind == NORMAL:
                self.count += 1

        def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool]:
            return self.index, self.count.to_bytes(8, "big"), True

        def install_chunk(self, chunk: SnapshotChunk) -> None:
            self.count = int.from_bytes(chunk.data, "big")
            self.index = chunk.index

    me = SITES[args.index]
    seeds = ",".join(f"{site}@127.0.0.1:{port}" for site, port in zip(SITES, args.ports,
                                                                        strict=True))
    config = load_config(overrides=[
        f"node.name={me}@127.0.0.1", f"node.cookie={COOKIE}", f"node.site_id={me}",
        f"node.data_dir={args.dir}", f"rpc.tcp_server_port={args.ports[args.index]}",
        "rpc.listen_address=127.0.0.1", "cluster.discovery_strategy=static",
        f"cluster.static.seeds={seeds}",
    ])
    cluster = Cluster(config)
    # The broker's Raft settings, turned into ticks as broker/cluster/metadata.py does: the
    # election time measured is the one its users get.
    tick = config["durable_storage.raft.heartbeat_interval"] / 2
    node = RaftNode(me, f"{args.dir}/raft", Links(), tick_seconds=tick,
                    election_ticks=max(3, round(
                        config["durable_storage.raft.election_timeout"] / tick)),
                    heartbeat_ticks=2,
                    segment_bytes=config["durable_storage.raft.wal_max_size_bytes"])
    # Logs are compacted as the broker does (and pysyncobj, every 5,000 entries, by
    # default): a log that grew for the whole run would measure the garbage collector.
    compact_entries: int = config["durable_storage.raft.snapshot_interval"]
    cluster.on(Channel.RAFT, node.receive)
    # As broker/cluster/metadata.py wires them: a dropped link's traffic is resent, and a
    # peer that closed its end (it died) has the groups it led elect at once.
    cluster.on_peer_down(node.unreachable)
    cluster.on_peer_closed(node.peer_lost)
    await cluster.start()
    groups = range(1, args.groups + 1)
    for group in groups:
        node.add_group(group, Counter(), voters=frozenset(SITES))
    commits = {group: Commits() for group in groups}
    payload = bytes(args.size)

    async def slot(group: int) -> None:
        core, mine = node.core(group), commits[group]
        while core.role == LEADER:
            proposed = time.monotonic()
            try:
                await node.propose(group, payload)
            except (NotLeader, CommandLost):
                return
            mine.add(proposed)

    async def drive(group: int) -> None:
        core = node.core(group)
        while True:
            await node.wait(lambda: core.role == LEADER)
            await asyncio.gather(*(slot(group) for _ in range(args.window)))

    async def compact() -> None:
        while True:
            await asyncio.sleep(0.1)
            for group in groups:
                core = node.core(group)
                if core.applied_index - core.log.snapshot_index >= compact_entries:
                    node.compact(group, core.applied_index)

    def sample() -> dict[str, Any]:
        wal = node.wal
        return {"leads": [g for g in groups if node.core(g).role == LEADER],
                "wal_fsyncs": wal.syncs, "wal_entries": wal.entries_written}

    await node.wait(lambda: all(node.core(g).leader is not None for g in groups))
    _tune_collector()  # as the broker does once started: its Raft runs with these settings
    reply({"ready": True})
    loop = asyncio.get_running_loop()
    tasks = [asyncio.create_task(compact())]
    try:
        while words := (await loop.run_in_executor(None, sys.stdin.readline)).split():
            if words[0] == "go":
                tasks += [asyncio.create_task(drive(group)) for group in groups]
                reply({"ok": True})
            else:
                reply(answer(words, commits, sample))
    finally:
        for task in tasks:
            task.cancel()
        await node.close()
        await cluster.stop()


# ------------------------------------------------------------------------------ pysyncobj

def pysyncobj(args: argparse.Namespace) -> None:
    from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

    class Counter(SyncObj):  # type: ignore[misc]  # (pysyncobj has no type hints)
        """The trivial state machine. pysyncobj's default persistence: no journal file, so
        the log is in memory and nothing is written to disk. Appends leave at once unless
        `--batch`: pysyncobj's default sends them only every appendEntriesPeriod (0.1 s),
        which caps a bounded window at `window` commits per 0.1 s."""

        def __init__(self, me: str, peers: list[str], driver: "Driver") -> None:
            super().__init__(me, peers, SyncObjConf(onStateChanged=driver.state_changed,
                                                    appendEntriesUseBatch=args.batch))
            self.count = 0
            self.bytes = 0

        @replicated  # type: ignore[misc]
        def add(self, data: bytes) -> None:
            self.count += 1
            self.bytes += len(data)

    class Driver:
        """Keeps `window` commands outstanding while its SyncObj leads. Callbacks run in the
        SyncObj's own thread, `go` in the main one: hence the lock."""

        def __init__(self, commits: Commits) -> None:
            self.commits = commits
            self.obj: Counter | None = None
            self.outstanding = 0
            self.going = False
            self.lock = threading.Lock()

        def top_up(self) -> None:
            obj = self.obj
            if obj is None or not self.going or not obj._isLeader():
                return
            with self.lock:
                missing = args.window - self.outstanding
                self.outstanding += missing
            for _ in range(missing):
                self.propose()

        def propose(self) -> None:
            assert self.obj is not None
            proposed = time.monotonic()
            self.obj.add(payload, callback=lambda _, error: self.done(proposed, error))

        def done(self, proposed: float, error: int) -> None:
            if error == FAIL_REASON.SUCCESS:
                self.commits.add(proposed)
                assert self.obj is not None
                if self.obj._isLeader():
                    self.propose()
                    return
            with self.lock:
                self.outstanding -= 1

        def state_changed(self, old: int, new: int) -> None:
            self.top_up()  # (a no-op unless it just became the leader)

    payload = bytes(args.size)
    groups = range(1, args.groups + 1)
    commits = {group: Commits() for group in groups}
    drivers = {group: Driver(commits[group]) for group in groups}
    objects: dict[int, Counter] = {}
    for group in groups:
        ports = args.ports[(group - 1) * 3:group * 3]
        addresses = [f"127.0.0.1:{port}" for port in ports]
        obj = Counter(addresses[args.index], [a for i, a in enumerate(addresses)
                                              if i != args.index], drivers[group])
        drivers[group].obj = objects[group] = obj
    while not all(obj._getLeader() is not None for obj in objects.values()):
        time.sleep(0.01)

    def sample() -> dict[str, Any]:
        return {"leads": [g for g, obj in objects.items() if obj._isLeader()]}

    reply({"ready": True})
    for line in sys.stdin:
        words = line.split()
        if not words:
            break
        if words[0] == "go":
            for driver in drivers.values():
                driver.going = True
                driver.top_up()
            reply({"ok": True})
        else:
            reply(answer(words, commits, sample))
    for obj in objects.values():
        obj.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=("ours", "pysyncobj"))
    parser.add_argument("--index", type=int, required=True, help="this process: 0, 1 or 2")
    parser.add_argument("--ports", type=lambda s: [int(p) for p in s.split(",")],
                        required=True, help="ours: 3 ports; pysyncobj: 3 per group")
    parser.add_argument("--groups", type=int, required=True)
    parser.add_argument("--window", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--batch", action="store_true",
                        help="pysyncobj: appendEntriesUseBatch (its default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.system == "ours":
        asyncio.run(ours(args))
    else:
        pysyncobj(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
