"""Every benchmark that feeds a table of the README, one after the other: what `make bench`
runs after bench/setup.sh.

    .venv/bin/python bench/every_table.py [--only results.json,raft_results.json] [--list]

Why a list in code and not lines of the Makefile: tests/docs checks that every
`bench/*results.json` a README table names is written by one of these steps, so a new table
cannot be left out of `make bench`. The whole stays within 30 minutes on the 2-core machine
by taking fewer rounds where a benchmark's full run takes several minutes (each step says
which); the README's table names the command of its own run, which may be the full one. Each
step's wall time is printed as it ends and a summary at the end; a failed step does not stop
the others, and the exit status is 1 if any failed.
"""

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
BUDGET_S = 30 * 60


@dataclass(frozen=True)
class Step:
    """One benchmark run: the JSON it writes (in bench/) and its script's arguments (run from
    the repository's root; no argument holds a space)."""

    writes: str
    argv: tuple[str, ...]
    why: str = ""
    """What the step leaves out of the benchmark's full run, and why."""


STEPS = (
    Step("results.json", ("run.py", "--only", "a,b,c,d")),
    Step("idle_results.json", ("run.py", "--only", "e", "--brokers", "ours,mosquitto",
                               "--output", "bench/idle_results.json")),
    Step("durable_results.json", ("durable_bench.py", "--pairs", "3"),
         "3 throughput pairs instead of 5"),
    Step("startup_results.json", ("startup_bench.py",)),
    Step("offline_results.json", ("offline_bench.py",)),
    Step("replay_results.json", ("replay_bench.py", "--rounds", "2"), "2 rounds instead of 4"),
    Step("ds_results.json", ("ds_bench.py",)),
    Step("compaction_results.json", ("compaction_bench.py", "--rounds", "1"),
         "one round instead of 3 (4,000,000 messages each way)"),
    Step("spark_results.json", ("spark_bench.py", "--repeat", "3"), "3 repeats instead of 5"),
    Step("spark_stream_results.json", ("spark_bench.py", "--stream", "--repeat", "2"),
         "2 repeats instead of 3"),
    Step("generation_interval_results.json", ("generation_interval_bench.py", "--repeat", "1"),
         "one repeat instead of 3"),
    Step("backup_results.json", ("backup_bench.py", "--rounds", "1"), "one round instead of 3"),
    Step("cluster_results.json", ("cluster_bench.py", "--pairs", "2"), "2 pairs instead of 3"),
    Step("raft_results.json", ("raft_bench.py",)),
    Step("replication_results.json", ("replication_bench.py", "--runs", "1"),
         "one run instead of 2"),
    Step("graceful_stop_results.json", ("graceful_stop_bench.py",)),
    Step("rolling_restart_results.json", ("rolling_restart_bench.py", "--rounds", "2"),
         "2 rolls per variant instead of 3"),
    Step("shared_results.json", ("shared_bench.py", "--rounds", "2"), "2 rounds instead of 3"),
    Step("shared_scale_results.json", ("shared_scale.py",)),
    Step("security_results.json", ("security_bench.py",)),
)


def _chosen(only: str | None) -> list[Step]:
    if not only:
        return list(STEPS)
    wanted = {name.strip() for name in only.split(",") if name.strip()}
    unknown = wanted - {step.writes for step in STEPS}
    if unknown:
        raise SystemExit(f"no step writes {sorted(unknown)}; "
                         f"choose from {', '.join(step.writes for step in STEPS)}")
    return [step for step in STEPS if step.writes in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="steps by the JSON they write, comma-separated")
    parser.add_argument("--list", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    steps = _chosen(args.only)
    times: list[tuple[Step, float, int]] = []
    for step in steps:
        shown = " ".join([f"bench/{step.argv[0]}", *step.argv[1:]])
        print(f"{'' if args.list else chr(10)}=== bench/{step.writes}: {shown}"
              + (f" ({step.why})" if step.why else ""), flush=True)
        if args.list:
            continue
        started = time.monotonic()
        code = subprocess.run([sys.executable, *shown.split()], cwd=BENCH_DIR.parent,
                              check=False).returncode
        times.append((step, time.monotonic() - started, code))
        print(f"=== bench/{step.writes}: {'ok' if code == 0 else f'FAILED ({code})'} in "
              f"{times[-1][1]:.0f} s", flush=True)
    if args.list:
        return 0
    total = sum(seconds for _, seconds, _ in times)
    print("\n" + "\n".join(f"{seconds:7.0f} s  {'ok    ' if code == 0 else 'FAILED'}  "
                           f"bench/{step.writes}" for step, seconds, code in times))
    print(f"{total:7.0f} s  in all (budget {BUDGET_S} s)")
    return 0 if all(code == 0 for _, _, code in times) else 1


if __name__ == "__main__":
    sys.exit(main())
