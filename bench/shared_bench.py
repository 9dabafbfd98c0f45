"""Durable shared subscriptions benchmark: 100 publishers -> a `$share` group of 4 durable
workers, against the same publishers -> one durable subscriber and the group as memory
sessions, on one node of ours and on 3 nodes with `builtin_raft` at RF 3; Mosquitto's
in-memory shared subscription as the peer.

    .venv/bin/python bench/shared_bench.py [--quick] [--configs ours1,ours3,mosquitto]
                                           [--kinds group,single,memory] [--rounds N]
                                           [--duration S] [--publishers N] [--workers N]

Every round (see bench/README.md, "Shared subscriptions benchmark") is MQTT 3.1.1, QoS 1,
100-byte payloads, the generator of run.py (`loadgen.py`), run by `cluster_bench.drive`:
  group:   the publishers -> `$share/workers/<topics>/+` held by 4 durable sessions (clean
           session 0, so Session Expiry = mqtt.session_expiry_interval);
  single:  (a) the same publishers -> one durable session subscribed to `<topics>/+`;
  memory:  (b) the group of `group` as memory sessions (clean session 1); Mosquitto runs
           only this one.
On 3 nodes the workers are dealt over the nodes (1, 2, 3, 1), the publishers too, and the
single subscriber is on node 1. Publishing starts once a message published on every
publishing node has reached a subscriber. Every payload carries its publisher's number and
sequence number, and every subscriber keeps those of what it received: lost and duplicated
messages (and those that reached two workers) are counted exactly, not inferred from totals.
The figure is deliveries/s over the window (every message delivered once, so deliveries =
messages), the median of `--rounds` rounds; PUBACK p50/p99 are the publishers' own
PUBLISH -> PUBACK times in the window; the spread is the most deliveries a worker got over
the fewest. One-node brokers run side by side (pinned to CPU 0 unless --no-pin), rounds
interleaved; ratios are medians of the ratios of rounds run one after the other.
Writes bench/shared_results.json.
"""

import argparse
import contextlib
import itertools
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, cluster_bench, replication_bench, report, wire
from bench.brokers import Running
from bench.cluster_bench import Load
from bench.loadgen import PublisherSpec, Shared, Spec, SubscriberSpec
from bench.replication_bench import N_SHARDS, REPLICATED, Config, collect, notes, percentile
from bench.scenarios import PAYLOAD, Timing, split, wait_until
from broker.ds.db import shard_of

RESULTS = Path(__file__).resolve().parent / "shared_results.json"
GROUP = "workers"
PUBLISHERS, WORKERS, ROUNDS = 100, 4, 3
WINDOW = 5
"""Unacknowledged PUBLISHes per publisher: 500 in all, as run.py's scenario d."""
MAX_LAG = cluster_bench.QOS1_MAX_LAG
"""Messages published but not yet delivered, all workers together: a member's share stays
far below ours' mqtt.max_mqueue_len and Mosquitto's max_queued_messages (1000 each)."""
PUB_PROCS = 2  # on one node; on a cluster one process per node
SENTINEL = 0xFF00
"""Publisher numbers from here on are the settling messages' (one per publishing node)."""
SENTINEL_RETRY = 0.5
SETTLE_TIMEOUT = 30.0
TARGET_SINGLE = 0.8  # durable group / durable subscriber (a), same cluster
TARGET_PEER = 0.5  # durable group on one node / Mosquitto's memory group


class Kind(NamedTuple):
    key: str
    title: str
    shared: bool
    clean: bool


KINDS = (Kind("group", "durable group", True, False),
         Kind("single", "durable subscriber (a)", False, False),
         Kind("memory", "memory group (b)", True, True))


MOSQUITTO = {"max_queued_messages": "0"}
"""Mosquitto 2.0.11's per-client queue count runs ahead of what its clients have received in
fan-in (bench/README.md, run.py's scenario d): with its default of 1000 it dropped ~750
acknowledged messages a round here, with the backlog held under MAX_LAG. No limit, as
durable_bench.py runs it; its other settings are its defaults (max_inflight_messages 20)."""
CONFIGS = (Config("mosquitto", "mosquitto x1", "mosquitto", 1, MOSQUITTO),
           Config("ours1", "ours x1 builtin_local", "ours", 1, {}),
           Config("ours3", "ours x3 builtin_raft RF 3", "ours", 3, REPLICATED))
"""In running order: the one-node brokers run side by side, Mosquitto's round just before
ours' group round. Mosquitto runs the memory group alone, ours every kind."""
RATIOS = (("ours1", "group", "ours1", "single", TARGET_SINGLE),
          ("ours3", "group", "ours3", "single", TARGET_SINGLE),
          ("ours1", "group", "mosquitto", "memory", TARGET_PEER),
          ("ours1", "group", "ours1", "memory", None),
          ("ours3", "group", "ours3", "memory", None),
          ("ours1", "memory", "mosquitto", "memory", None))


def balanced_ids(label: str, count: int, shards: int) -> list[str]:
    """Publisher client IDs whose shards (where ours stores their messages, and by which a
    durable group deals them out) each hold count // shards or one more: the workers' spread
    then shows how the broker deals the shards, not how the IDs happened to hash."""
    floor, extra = divmod(count, shards)
    held, ids = [0] * shards, []
    for n in itertools.count():
        if len(ids) == count:
            return ids
        client_id = f"bench-{label}-pub{n}"
        shard = shard_of(client_id, shards)
        if held[shard] < floor or (held[shard] == floor and extra > 0):
            extra -= held[shard] == floor
            held[shard] += 1
            ids.append(client_id)
    raise AssertionError("unreachable")


def sentinels(members: list[Running], nodes: list[int], topic: str, label: str
              ) -> cluster_bench.Settle:
    """Settling for any broker and subscription: from each publishing node, one identified
    QoS 1 message (again every SENTINEL_RETRY s) until a subscriber counted one of them. A
    message that arrived shows that node routes (or stores) for the subscribers."""
    def settle(shared: Shared, watch: Callable[[], None]) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        for node in nodes:
            with socket.create_connection(("127.0.0.1", members[node].port), 10) as sock:
                sock.sendall(wire.connect(f"bench-{label}-sentinel{node}"))
                wire.recv_exact(sock, wire.CONNACK_SIZE)
                for attempt in itertools.count():
                    received = sum(shared.delivered)
                    payload = wire.IDENTITY.pack(SENTINEL + node, attempt)
                    sock.sendall(wire.publish(topic, payload + PAYLOAD[len(payload):], 1,
                                              attempt % 0xFFFF + 1))
                    wire.recv_exact(sock, 4)  # its PUBACK
                    wait_until(lambda r=received: sum(shared.delivered) > r, lambda: 0,
                               SENTINEL_RETRY, SENTINEL_RETRY, watch)
                    if sum(shared.delivered) > received:
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no message published on node {node + 1} reached "
                                           f"a subscriber within {SETTLE_TIMEOUT:.0f}s")
                sock.sendall(wire.DISCONNECT)

    return settle


def tally(records: list[bytes], published: int) -> dict[str, Any]:
    """Exact counts from the identities each worker received (`records`, one per worker):
    `lost` = acknowledged but never received, `duplicates` = received more than once (of
    them `cross_worker_duplicates` by another worker than the first), `reordered` = a
    publisher's message received by a worker after a later one of the same publisher,
    `split_publishers` = publishers whose messages went to more than one worker."""
    first: dict[tuple[int, int], int] = {}
    workers_of: dict[int, set[int]] = {}
    per_worker: list[int] = []
    sentinels_received = duplicates = across = reordered = 0
    for worker, data in enumerate(records):
        last: dict[int, int] = {}
        received = 0
        for identity in wire.IDENTITY.iter_unpack(data):
            publisher, sequence = identity
            if publisher >= SENTINEL:
                sentinels_received += 1
                continue
            received += 1
            reordered += sequence < last.get(publisher, -1)
            last[publisher] = sequence
            if identity in first:
                duplicates += 1
                across += first[identity] != worker
            else:
                first[identity] = worker
        per_worker.append(received)
        for publisher in last:
            workers_of.setdefault(publisher, set()).add(worker)
    return {"worker_deliveries": per_worker, "unique": len(first),
            "lost": max(published - len(first), 0), "duplicates": duplicates,
            "cross_worker_duplicates": across, "reordered": reordered,
            "split_publishers": sum(len(w) > 1 for w in workers_of.values()),
            "sentinels_received": sentinels_received}


def measure(kind: Kind, members: list[Running], timing: Timing, label: str, publishers: int,
            workers: int) -> dict[str, Any]:
    """One round on a running broker or cluster (`cluster_bench.drive`), its counts checked
    by identity."""
    nodes = len(members)
    topics = [f"bench/shared/{label}/{i:03d}" for i in range(publishers)]
    layout = wire.publish_layout(topics[0], PAYLOAD, 1)
    topic_filter = f"bench/shared/{label}/+"
    if kind.shared:
        topic_filter = f"$share/{GROUP}/{topic_filter}"
    worker_nodes = [i % nodes for i in range(workers if kind.shared else 1)]
    ids = balanced_ids(label, publishers, N_SHARDS)
    publisher_nodes = [i % nodes for i in range(publishers)]
    with tempfile.TemporaryDirectory(prefix="bench-shared-") as tmp:
        records = [Path(tmp, f"worker{i}") for i in range(len(worker_nodes))]
        specs: list[Spec] = [
            SubscriberSpec(members[node].port, [f"bench-{label}-w{i}"], topic_filter, 1,
                           layout, clean=kind.clean, record=str(records[i]))
            for i, node in enumerate(worker_nodes)]
        parts = [(node, part) for node in range(nodes)
                 for part in split(range(node, publishers, nodes), max(1, PUB_PROCS // nodes))]
        specs += [PublisherSpec(members[node].port, [ids[i] for i in part],
                                [topics[i] for i in part], PAYLOAD, 1, subscribers=1,
                                max_lag=MAX_LAG, peers=len(parts), window=WINDOW,
                                identities=tuple(part))
                  for node, part in parts]
        load = Load(specs, len(worker_nodes), 1, 1)
        settle = sentinels(members, sorted(set(publisher_nodes)), topics[0], label)
        run = cluster_bench.drive(load, members, timing, settle)
        counted = tally([path.read_bytes() for path in records], run.published)
    cell = {**cluster_bench.figures(run, load), **counted}
    cell["verified"] = run.unacked == 0 and counted["lost"] == counted["duplicates"] == 0
    cell["worker_nodes"] = [n + 1 for n in worker_nodes]
    per_worker = counted["worker_deliveries"]
    cell["spread"] = (round(max(per_worker) / min(per_worker), 3)
                      if kind.shared and min(per_worker) else None)
    pubacks = [s * 1000 for s in run.shared.puback_seconds(range(load.subscribers,
                                                                 len(specs)))]
    cell["puback_samples"] = len(pubacks)
    if pubacks:
        cell.update({f"puback_{name}_ms": round(percentile(pubacks, q), 2)
                     for name, q in (("p50", 50), ("p99", 99), ("max", 100))})
    return cell


def run_round(kind: Kind, members: list[Running], timing: Timing, label: str,
              publishers: int, workers: int) -> dict[str, Any]:
    """`measure` (`cluster_bench.attempt`), printed as it ends."""
    cell = cluster_bench.attempt(label, members, lambda: measure(
        kind, members, timing, label, publishers, workers))
    if "error" in cell:
        return cell
    counts = "ok" if cell["verified"] else (
        f"COUNTS DO NOT ADD UP: lost {cell['lost']}, duplicates {cell['duplicates']} "
        f"({cell['cross_worker_duplicates']} across workers), unacked "
        f"{cell['unacked_by_broker']}")
    print(f"{cell['msgs_per_s']:>8,} deliveries/s; PUBACK p50 {cell.get('puback_p50_ms')} "
          f"p99 {cell.get('puback_p99_ms')} ms; workers {cell['worker_deliveries']}; "
          f"CPU {'/'.join(f'{c:.2f}' for c in cell['node_cpu'])}; other load "
          f"{cell['other_cpu']:.2f}; {counts}", flush=True)
    return cell


@contextlib.contextmanager
def started(config: Config) -> Iterator[list[Running]]:
    """The configuration's broker, or cluster once every Raft group has a leader."""
    if config.nodes == 1:
        launcher = (brokers.ours_with(config.settings) if config.broker == "ours" else
                    brokers.mosquitto_with("".join(f"{k} {v}\n"
                                                   for k, v in config.settings.items())))
        with brokers.running(config.broker, launcher=launcher) as broker:
            yield [broker]
        return
    with brokers.running_cluster(config.broker, config.nodes, config.settings) as members:
        if config.settings.get("durable_storage.messages.backend") == "builtin_raft":
            replication_bench.wait_led(members)
        yield members


def run_stage(configs: list[Config], kinds: list[str], timing: Timing, rounds: int,
              publishers: int, workers: int) -> dict[str, dict[str, Any]]:
    """The configurations up at once; `rounds` times each one's kinds in turn. A
    configuration that does not start, or whose node dies, fails its remaining rounds."""
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {
        c.key: {k: [] for k in kinds if c.broker == "ours" or k == "memory"}
        for c in configs}
    with contextlib.ExitStack() as stack:
        up: dict[str, list[Running]] = {}
        for config in configs:
            began = time.monotonic()
            try:
                up[config.key] = stack.enter_context(started(config))
            except Exception as exc:
                _fail(cells[config.key], rounds, f"{type(exc).__name__}: {exc}")
                print(f"{config.title}: FAILED {str(exc)[:300]}", flush=True)
                continue
            print(f"{config.title}: up in {time.monotonic() - began:.1f}s (pids "
                  f"{[m.pid for m in up[config.key]]})", flush=True)
        for n, config in itertools.product(range(rounds), configs):
            if config.key not in up:
                continue
            try:
                for kind in (k for k in KINDS if k.key in cells[config.key]):
                    cells[config.key][kind.key].append(run_round(
                        kind, up[config.key], timing, f"{config.key}-{kind.key}-{n + 1}",
                        publishers, workers))
            except Exception as exc:
                print(f"{config.title}: FAILED {str(exc)[:300]}", flush=True)
                _fail(cells[config.key], rounds, f"{type(exc).__name__}: {exc}")
                del up[config.key]
    return {c.key: summarize(c, cells[c.key]) for c in configs}


def _fail(cells: dict[str, list[dict[str, Any]]], rounds: int, error: str) -> None:
    for done in cells.values():
        done += [{"error": error}] * (rounds - len(done))


def summarize(config: Config, cells: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per kind its median round (whole) and every round (`replication_bench.collect`)."""
    return {"config": config.title, "broker": config.broker, "nodes": config.nodes,
            "settings": config.settings, **collect(cells)}


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per pair of RATIOS both ran: a / b of the rate for each round index both have, their
    median, the target and whether it was met."""
    out: dict[str, dict[str, Any]] = {}
    for a, ka, b, kb, target in RATIOS:
        left = results.get(a, {}).get(f"{ka}_rounds", [])
        right = results.get(b, {}).get(f"{kb}_rounds", [])
        if not left or not right:
            continue
        pairs = [round(x["msgs_per_s"] / y["msgs_per_s"], 3)
                 for x, y in zip(left, right, strict=True)
                 if x.get("msgs_per_s") and y.get("msgs_per_s")]
        median = sorted(pairs)[(len(pairs) - 1) // 2] if pairs else None
        out[f"{a}.{ka}/{b}.{kb}"] = {"pairs": pairs, "median": median, "target": target,
                                     "met": None if target is None or median is None
                                     else median >= target}
    return out


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "/".join(_num(v, digits) for v in value)
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


COLUMNS = (("msgs_per_s", "deliveries/s"), ("puback_p50_ms", "PUBACK p50 ms"),
           ("puback_p99_ms", "p99 ms"), ("spread", "spread max/min"),
           ("worker_deliveries", "per worker"), ("lost", "lost"), ("duplicates", "dup"),
           ("cluster_cpu_us_per_msg", "CPU us/msg"))


def table(results: dict[str, dict[str, Any]], found: dict[str, dict[str, Any]]) -> str:
    rows = [["configuration: subscription", *(label for _, label in COLUMNS)]]
    for result in results.values():
        for kind in KINDS:
            if f"{kind.key}_rounds" not in result:
                continue
            cell = result.get(kind.key)
            row = [f"{result['config']}: {kind.title}"]
            if cell is None:
                rows.append([*row, "FAILED", *([""] * (len(COLUMNS) - 1))])
                continue
            row += [_num(cell.get(key), 2) for key, _ in COLUMNS]
            row[1] += "" if cell["verified"] else " *"
            rows.append(row)
    lines = report.align(rows)
    if any(row[1].endswith(" *") for row in rows[1:]):
        lines.append("* counts did not add up in some round (lost, duplicates or "
                     "unacknowledged: see `<kind>_rounds` in the JSON)")
    lines += ["", *report.align([["ratio of deliveries/s (median of rounds side by side)",
                                  "median", "rounds", "target"]] + [
        [name, "-" if r["median"] is None else f"{r['median']:.2f}x",
         " ".join(f"{p:.2f}" for p in r["pairs"]),
         "" if r["target"] is None else
         f">= {r['target']}x {'met' if r['met'] else 'NOT met'}"]
        for name, r in found.items()])]
    for key, result in results.items():
        lines += notes(key, result, [kind.key for kind in KINDS])
    return "\n".join(lines)


def _names(text: str, known: tuple[str, ...], what: str) -> list[str]:
    picked = [n.strip() for n in text.split(",") if n.strip()]
    if bad := [n for n in picked if n not in known]:
        raise SystemExit(f"unknown {what} {bad}; choose from {', '.join(known)}")
    return picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(c.key for c in CONFIGS),
                        help="comma-separated subset of: " + ",".join(c.key for c in CONFIGS))
    parser.add_argument("--kinds", default=",".join(k.key for k in KINDS),
                        help="comma-separated subset of: " + ",".join(k.key for k in KINDS))
    parser.add_argument("--rounds", type=int, help=f"rounds of each kind ({ROUNDS})")
    parser.add_argument("--duration", type=float, help="measured window per round (5 s)")
    parser.add_argument("--warmup", type=float, help="unmeasured ramp-up per round (2 s)")
    parser.add_argument("--publishers", type=int, default=PUBLISHERS,
                        help=f"publisher connections ({PUBLISHERS}, at most 1000)")
    parser.add_argument("--workers", type=int, default=WORKERS,
                        help=f"members of the group ({WORKERS})")
    parser.add_argument("--quick", action="store_true",
                        help="0.5 s warm-up, 1 s windows, one round each: a smoke run")
    parser.add_argument("--no-pin", action="store_true",
                        help="don't pin one-node brokers to CPU 0 and the generator to CPU 1")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of ours, on top of each configuration's (repeatable)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results JSON path")
    args = parser.parse_args(argv)
    keys = _names(args.configs, tuple(c.key for c in CONFIGS), "configuration(s)")
    kinds = _names(args.kinds, tuple(k.key for k in KINDS), "kind(s)")
    if not 1 <= args.publishers <= 1000 or args.workers < 1:
        raise SystemExit("--publishers must be 1..1000 and --workers at least 1")
    if bad := [item for item in args.set if "=" not in item]:
        raise SystemExit(f"--set takes KEY=VALUE, not {bad[0]!r}")
    extra = dict(item.split("=", 1) for item in args.set)
    configs = [c._replace(settings={**c.settings, **extra}) if c.broker == "ours" else c
               for c in CONFIGS if c.key in keys]
    timing = Timing(warmup=args.warmup if args.warmup is not None else
                    (0.5 if args.quick else 2.0),
                    duration=args.duration or (1.0 if args.quick else 5.0), idle_connections=0)
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    versions = {b: brokers.version(b) for b in dict.fromkeys(c.broker for c in configs)}
    print(f"brokers: {versions}; {args.publishers} publishers, {args.workers} workers; "
          f"{rounds} round(s), window {timing.duration}s after {timing.warmup}s; load "
          f"average {os.getloadavg()[0]:.2f}")
    brokers.set_pinning(not args.no_pin)
    env = report.environment(versions, timing, brokers.load_cpus())
    env.pop("idle_connections")
    env.update({"configs": {c.key: c.title for c in configs}, "kinds": kinds, "rounds": rounds,
                "publishers": args.publishers, "workers": args.workers, "group": GROUP,
                "publisher_window": WINDOW, "max_lag": MAX_LAG, "n_shards": N_SHARDS,
                "one_node_pinned": not args.no_pin})
    started_at = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    for nodes in sorted({c.nodes for c in configs}):
        brokers.set_pinning(nodes == 1 and not args.no_pin)  # clusters are never pinned
        stage = [c for c in configs if c.nodes == nodes]
        results.update(run_stage(stage, kinds, timing, rounds, args.publishers, args.workers))
    results = {c.key: results[c.key] for c in configs if c.key in results}
    found = ratios(results)
    env["loadavg_at_end"] = os.getloadavg()[0]
    env["total_runtime_s"] = round(time.monotonic() - started_at, 1)
    report.write_json({"environment": env, "results": results, "ratios": found}, args.output)
    print("\n" + table(results, found))
    print(f"\nwrote {args.output} in {env['total_runtime_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
