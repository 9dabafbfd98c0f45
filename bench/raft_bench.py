"""Raft benchmark (issue 17): our Raft against pysyncobj 0.3.17, three local processes each.

    .venv/bin/python bench/raft_bench.py [--quick] [--duration S] [--groups 1,16]
                                         [--systems ours,pysyncobj] [--window W]
                                         [--pysyncobj-batch]

For each group count and system, three fresh processes on loopback (bench/raft_worker.py)
host every group; each group's leader keeps `window` proposals of 100 bytes outstanding.
Ours: a RaftNode per process with the broker's Raft settings, its write-ahead log
fdatasync'd (group commit) in a temp dir, linked by broker.cluster's Cluster. pysyncobj: one
SyncObj per group (a thread and a port each) with its default persistence, a log in memory
and nothing written to disk: its throughput without any fsync is the bar ours has to reach
while fsyncing. Its appends leave at once (appendEntriesUseBatch off) unless
--pysyncobj-batch: batched, they wait for its 0.1 s append period, which caps a window of W
at 10 W commits/s.

Measured, after a warm-up, over one window: commits/s (all leaders), commit latency p50/p99
(proposal to the leader seeing it committed), entries per fsync (ours: all three nodes'
write-ahead logs); then the process leading the most groups is killed with SIGKILL and the
election time is measured from the kill to the first commit of a new leader, for each group
it led (the table shows the slowest). Writes bench/raft_results.json.
"""

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, procstat, report

RESULTS = brokers.BENCH_DIR / "raft_results.json"
WORKER = brokers.BENCH_DIR / "raft_worker.py"
SYSTEMS = ("ours", "pysyncobj")
PYTHONS = {"ours": Path(sys.executable),
           "pysyncobj": brokers.BENCH_DIR / ".venv-pysyncobj" / "bin" / "python"}
NODES = 3
ENTRY_BYTES = 100
WINDOW = 64
"""Proposals outstanding per group (a publisher's in-flight window)."""
READY_TIMEOUT = 60.0
"""Start-up until every process knows a leader of every group (pysyncobj retries a refused
connection every 5 s: processes that start before their peers listen wait that long)."""
REPLY_TIMEOUT = 30.0
ELECTION_LIMIT = 30.0
STOP_TIMEOUT = 5.0


class WorkerFailed(RuntimeError):
    """A worker died or went silent, or the cell measured nothing: that cell is FAILED and
    the run goes on."""


@dataclass(slots=True)
class Worker:
    """One process of the cluster and its command pipe (see raft_worker.py)."""

    proc: "subprocess.Popen[bytes]"
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, command: str) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(command.encode() + b"\n")
        stdin.flush()

    def receive(self, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        """The next reply line, or WorkerFailed (with the log's tail) if the process dies or
        stays silent: a stuck run must end by itself."""
        stdout: IO[bytes] | None = self.proc.stdout
        assert stdout is not None
        if select.select([stdout], [], [], timeout)[0]:
            line = stdout.readline()
            if line:
                return dict(json.loads(line))
        state = "gave no answer" if self.proc.poll() is None else "exited"
        raise WorkerFailed(f"worker {self.pid} {state}:\n{self.log_tail()}")

    def ask(self, command: str) -> dict[str, Any]:
        self.send(command)
        return self.receive()

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """End of stdin makes a worker exit; SIGKILL if it has not after STOP_TIMEOUT."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)


def version(system: str) -> str:
    if system == "ours":
        return brokers.version("ours")
    try:
        return subprocess.run(
            [str(PYTHONS[system]), "-c", "import importlib.metadata as m; "
             "print(m.version('pysyncobj'))"],
            capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "not installed"


def _ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(brokers.free_port())
    return sorted(ports)


def _spawn(system: str, groups: int, window: int, batch: bool, tmp: Path,
           workers: list[Worker]) -> None:
    """Starts the three workers into `workers`, which the caller stops whatever happens."""
    python = PYTHONS[system]
    if not python.exists():
        raise WorkerFailed(f"{python} does not exist: run bench/setup.sh")
    ports = ",".join(map(str, _ports(NODES if system == "ours" else NODES * groups)))
    for index in range(NODES):
        directory = tmp / f"n{index}"
        directory.mkdir()
        log = directory / "worker.log"
        argv = [str(python), str(WORKER), system, "--index", str(index), "--ports", ports,
                "--groups", str(groups), "--window", str(window), "--size", str(ENTRY_BYTES),
                "--dir", str(directory), *(["--batch"] if batch else [])]
        with log.open("wb") as err:
            workers.append(Worker(subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                cwd=directory, start_new_session=True), log))


def _percentile(ordered: list[int], fraction: float) -> float:
    """Nearest rank, in ms."""
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] / 1000


def measure(system: str, groups: int, warmup: float, duration: float,
            window: int = WINDOW, batch: bool = False) -> dict[str, Any]:
    """One cell: fresh processes, warm-up, the measured window, then the kill."""
    tmp = Path(tempfile.mkdtemp(prefix=f"raft-bench-{system}-"))
    workers: list[Worker] = []
    try:
        started = time.monotonic()
        _spawn(system, groups, window, batch, tmp, workers)
        for worker in workers:
            worker.receive(READY_TIMEOUT)
        ready_s = time.monotonic() - started
        for worker in workers:
            worker.ask("go")
        time.sleep(warmup)
        pids = [w.pid for w in workers]
        t0, cpu0, busy0 = (time.monotonic(), sum(map(procstat.cpu_seconds, pids)),
                           procstat.machine_busy_seconds())
        before = [w.ask("sample") for w in workers]
        time.sleep(duration)
        t1, cpu1, busy1 = (time.monotonic(), sum(map(procstat.cpu_seconds, pids)),
                           procstat.machine_busy_seconds())
        after = [w.ask("sample") for w in workers]
        reports = [w.ask(f"report {t0} {t1}") for w in workers]
        seconds = t1 - t0
        latencies = sorted(x for r in reports for x in r["latencies_us"])
        commits = sum(r["commits"] for r in reports)
        if not commits:
            raise WorkerFailed("no commit in the measured window")
        cell: dict[str, Any] = {
            "ok": True, "ready_s": round(ready_s, 2), "commits": commits,
            "commits_per_s": round(commits / seconds),
            "latency_p50_ms": _percentile(latencies, 0.50),
            "latency_p99_ms": _percentile(latencies, 0.99),
            "leaders_per_process": [len(s["leads"]) for s in after],
            "cpu": round((cpu1 - cpu0) / seconds, 2),
            "cpu_us_per_commit": round((cpu1 - cpu0) / commits * 1e6, 1),
            "other_cpu": round(max(0.0, busy1 - busy0 - (cpu1 - cpu0)) / seconds, 2),
        }
        if system == "ours":
            fsyncs = sum(a["wal_fsyncs"] - b["wal_fsyncs"] for a, b in zip(after, before,
                                                                           strict=True))
            entries = sum(a["wal_entries"] - b["wal_entries"] for a, b in zip(after, before,
                                                                              strict=True))
            cell.update({"fsyncs_per_s": round(fsyncs / seconds),
                         "entries_per_fsync": round(entries / fsyncs, 1) if fsyncs else None})
        cell.update(_election(workers, after))
        return cell
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        for worker in workers:
            worker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _election(workers: list[Worker], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """SIGKILL the process leading the most groups; for each group it led, seconds from the
    kill to the first commit a survivor made as the new leader."""
    victim = max(range(len(workers)), key=lambda i: len(samples[i]["leads"]))
    lost: list[int] = samples[victim]["leads"]
    if not lost:
        raise WorkerFailed("no process leads a group")
    survivors = [w for i, w in enumerate(workers) if i != victim]
    killed = time.monotonic()
    os.kill(workers[victim].pid, signal.SIGKILL)
    workers[victim].proc.wait(STOP_TIMEOUT)
    wanted = ",".join(map(str, lost))
    first: dict[str, float] = {}
    while len(first) < len(lost):
        if time.monotonic() - killed > ELECTION_LIMIT:
            raise WorkerFailed(f"groups {sorted(set(map(str, lost)) - set(first))} had no "
                               f"commit {ELECTION_LIMIT:.0f} s after their leader's kill")
        time.sleep(0.1)
        for worker in survivors:
            for group, at in worker.ask(f"first {killed} {wanted}")["first"].items():
                if at is not None:
                    first[group] = min(first.get(group, at), at)
    elections = sorted(at - killed for at in first.values())
    return {"killed_leader_of": len(lost), "election_s": round(elections[-1], 3),
            "election_median_s": round(statistics.median(elections), 3),
            "election_per_group_s": {g: round(at - killed, 3) for g, at in sorted(
                first.items(), key=lambda item: int(item[0]))}}


COLUMNS: tuple[tuple[str, str, str], ...] = (
    # key, heading, format
    ("commits_per_s", "commits/s", "{:,}"),
    ("latency_p50_ms", "p50 ms", "{:.1f}"),
    ("latency_p99_ms", "p99 ms", "{:.1f}"),
    ("entries_per_fsync", "entries/fsync", "{:.1f}"),
    ("election_s", "election s", "{:.2f}"),
    ("cpu", "CPU", "{:.2f}"),
    ("cpu_us_per_commit", "CPU us/commit", "{:.1f}"),
    ("other_cpu", "other CPU", "{:.2f}"),
)
RATIOS = ("commits_per_s", "latency_p50_ms", "latency_p99_ms", "election_s",
          "cpu_us_per_commit")


def ratios(cells: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """ours/pysyncobj per group count: above 1 is better for commits/s, worse for the
    others (times, CPU per commit)."""
    out: dict[str, dict[str, float | None]] = {}
    for groups, row in cells.get("ours", {}).items():
        peer = cells.get("pysyncobj", {}).get(groups)
        if peer is None:
            continue
        out[groups] = {key: round(row[key] / peer[key], 3)
                       if row.get(key) is not None and peer.get(key) else None
                       for key in RATIOS}
    return out


def table(cells: dict[str, dict[str, dict[str, Any]]],
          ratio_rows: dict[str, dict[str, float | None]]) -> str:
    header = ["system", "groups", *(heading for _, heading, _ in COLUMNS)]
    rows = [header]
    failures: list[str] = []
    for groups in dict.fromkeys(g for by_groups in cells.values() for g in by_groups):
        for system, by_groups in cells.items():
            cell = by_groups.get(groups)
            if cell is None:
                continue
            if not cell["ok"]:
                rows.append([system, groups, "FAILED", *([""] * (len(COLUMNS) - 1))])
                failures.append(f"  {system}/{groups}: {cell['error'].splitlines()[0][:300]}")
                continue
            rows.append([system, groups, *(
                "n/a" if cell.get(key) is None else form.format(cell[key])
                for key, _, form in COLUMNS)])
        ratio = ratio_rows.get(groups)
        if ratio is not None:
            rows.append(["ours/pysyncobj", groups, *(
                ("-" if ratio[key] is None else f"{ratio[key]:.2f}x") if key in ratio else ""
                for key, _, _ in COLUMNS)])
    lines = report.align(rows)
    if ratio_rows:
        lines += ["", "ours/pysyncobj: above 1.00x is better for commits/s, below 1.00x for "
                      "the others"]
    if failures:
        lines += ["", "FAILED:", *failures]
    busy = max((c.get("other_cpu", 0.0) for g in cells.values() for c in g.values()),
               default=0.0)
    if busy > report.BUSY_MACHINE:
        lines += ["", f"warning: other processes kept up to {busy:.1f} CPUs busy during the "
                  "measured windows (other_cpu): numbers are noisy; rerun on a quiet machine"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="0.5 s warm-up, 1 s window: a smoke run, not a measurement")
    parser.add_argument("--duration", type=float, help="measured window, s (default 10)")
    parser.add_argument("--warmup", type=float, help="unmeasured ramp-up, s (default 2)")
    parser.add_argument("--groups", default="1,16", help="group counts, comma-separated")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="comma-separated subset of: " + ",".join(SYSTEMS))
    parser.add_argument("--window", type=int, default=WINDOW,
                        help=f"proposals outstanding per group (default {WINDOW})")
    parser.add_argument("--pysyncobj-batch", action="store_true",
                        help="pysyncobj with its default appendEntriesUseBatch=True: appends"
                             " leave every 0.1 s, so a window of W commits at most 10 W/s")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results JSON path")
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if bad := [s for s in systems if s not in SYSTEMS]:
        raise SystemExit(f"unknown system(s) {bad}; choose from {', '.join(SYSTEMS)}")
    group_counts = [int(g) for g in args.groups.split(",")]
    warmup = args.warmup if args.warmup is not None else 0.5 if args.quick else 2.0
    duration = args.duration if args.duration is not None else 1.0 if args.quick else 10.0
    versions = {s: version(s) for s in systems}
    env = {**report.machine(), "versions": versions, "processes": NODES,
           "entry_bytes": ENTRY_BYTES, "window_per_group": args.window, "warmup_s": warmup,
           "duration_s": duration, "pysyncobj_append_batching": args.pysyncobj_batch}
    print(f"systems: {versions}; groups {group_counts}; window {args.window} per group; "
          f"load average {os.getloadavg()[0]:.2f}")
    started = time.monotonic()
    cells: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in systems}
    for groups in group_counts:  # systems in turn per group count: a drift hits both
        for system in systems:
            print(f"  {system:<10} {groups:>3} groups", end=" ", flush=True)
            cell = measure(system, groups, warmup, duration, args.window,
                           args.pysyncobj_batch)
            print({k: v for k, v in cell.items() if k != "election_per_group_s"}, flush=True)
            cells[system][str(groups)] = cell
    ratio_rows = ratios(cells)
    env["loadavg_at_end"] = os.getloadavg()[0]
    env["total_runtime_s"] = round(time.monotonic() - started, 1)
    report.write_json({"environment": env, "results": cells, "ratios": ratio_rows},
                      args.output)
    print("\n" + table(cells, ratio_rows))
    print(f"\nwrote {args.output} in {env['total_runtime_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
