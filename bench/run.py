"""Entry point: benchmark our broker against Mosquitto and amqtt in one run.

    .venv/bin/python bench/run.py [--quick] [--only a,c] [--brokers ours,mosquitto]
                                  [--duration SECONDS]

Scenarios run in order, and within a scenario each broker in turn on a fresh broker process,
so slow drifts of the machine hit all brokers alike. Prints a table and writes
bench/results.json.
"""

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, report
from bench.scenarios import SCENARIOS, Outcome, Scenario, Timing, run

RESULTS = Path(__file__).resolve().parent / "results.json"
ALL_BROKERS = ("ours", "mosquitto", "amqtt")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated scenario keys or names (e.g. a,b)")
    parser.add_argument("--duration", type=float, help="measured window per scenario, seconds")
    parser.add_argument("--warmup", type=float, help="unmeasured ramp-up before the window")
    parser.add_argument("--connections", type=int, help="idle connections for scenario e")
    parser.add_argument("--quick", action="store_true",
                        help="1 s windows and 1000 idle connections (under a minute)")
    brokers.add_arguments(parser, ALL_BROKERS, RESULTS)
    return parser.parse_args(argv)


def _select(only: str | None) -> list[Scenario]:
    if not only:
        return list(SCENARIOS)
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    chosen = [s for s in SCENARIOS if s.key in wanted or s.name in wanted]
    unknown = wanted - {s.key for s in chosen} - {s.name for s in chosen}
    if unknown:
        names = ", ".join(f"{s.key}={s.name}" for s in SCENARIOS)
        raise SystemExit(f"unknown scenario(s) {sorted(unknown)}; choose from {names}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    scenarios = _select(args.only)
    names = brokers.chosen(args, ALL_BROKERS)
    timing = Timing(
        warmup=args.warmup if args.warmup is not None else (0.5 if args.quick else 2.0),
        duration=args.duration or (1.0 if args.quick else 5.0),
        idle_connections=args.connections or (1_000 if args.quick else 10_000),
    )
    versions = {b: brokers.version(b) for b in names}
    where = (f"broker on CPU {brokers.BROKER_CPU}, load on CPUs {sorted(brokers.load_cpus())}"
             if brokers.pinned() else "no CPU pinning")
    print(f"brokers: {versions}; window {timing.duration}s after {timing.warmup}s warm-up; "
          f"{where}")
    env = report.environment(versions, timing, brokers.load_cpus())
    started = time.monotonic()
    outcomes: dict[tuple[str, str], Outcome] = {}
    for sc in scenarios:
        print(f"\n{sc.key}) {sc.title}" + (f" (N={timing.idle_connections})" if sc.idle else ""))
        for name in names:
            outcome = run(sc, name, timing)
            outcomes[(sc.name, name)] = outcome
            print(report.detail_lines(outcome), flush=True)
    env["total_runtime_s"] = round(time.monotonic() - started, 1)
    data = report.to_json(scenarios, names, outcomes, env)
    report.write_json(data, args.output)
    print("\n" + report.table(scenarios, names, outcomes))
    if (names == list(ALL_BROKERS) and set(report.README_ROWS) <= set(data["scenarios"])
            and all(o.ok for o in outcomes.values())):
        print("\nthe README's table (bench/README.md):\n" + report.readme_table(data))
    print(f"\nwrote {args.output} in {env['total_runtime_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
