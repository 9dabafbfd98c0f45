"""Turns outcomes into the printed comparison table and `bench/results.json`.

The JSON is the machine-readable record (for tracking regressions over time); the table is
for a human reading the terminal. Both carry the ratios ours/mosquitto and ours/amqtt.
"""

import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import brokers
from bench.scenarios import Outcome, Scenario, Timing
from broker.native import compiled_modules

PEERS = ("mosquitto", "amqtt")
BUSY_MACHINE = 0.25
"""CPUs of load from other processes above which the table warns that numbers are noisy."""


def _ratio(ours: Outcome | None, peer: Outcome | None) -> float | None:
    if not (ours and peer and ours.ok and peer.ok and ours.value is not None and peer.value):
        return None
    return ours.value / peer.value


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """The moment and machine of a run: results are only comparable within one (benchmarks
    that are not MQTT scenarios, raft_bench.py, use this part of `environment` alone)."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg()[0],
        "python": sys.version.split()[0],
    }


def build() -> str:
    """Whether this tree's `broker` runs compiled or as pure Python, for a benchmark that runs
    the engine in its own process: the README's figures differ by up to 2x between the two."""
    return "native" if compiled_modules() else "pure Python"


def environment(versions: dict[str, str], timing: Timing, load_cpus: set[int]) -> dict[str, Any]:
    return {
        **machine(),
        "broker_versions": versions,
        "broker_cpu_pinned": brokers.BROKER_CPU if brokers.pinned() else None,
        "load_generator_cpus": sorted(load_cpus),
        "protocol": "MQTT 3.1.1",
        "payload_bytes": 100,
        "warmup_s": timing.warmup,
        "duration_s": timing.duration,
        "idle_connections": timing.idle_connections,
    }


def _cell(outcome: Outcome) -> dict[str, Any]:
    return {
        "ok": outcome.ok,
        "value": outcome.value,
        "verified": outcome.verified,
        "error": outcome.error,
        **outcome.details,
    }


def to_json(scenarios: list[Scenario], brokers: list[str],
            outcomes: dict[tuple[str, str], Outcome], env: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"environment": env, "scenarios": {}}
    for sc in scenarios:
        cells = {b: outcomes[(sc.name, b)] for b in brokers if (sc.name, b) in outcomes}
        out["scenarios"][sc.name] = {
            "key": sc.key,
            "title": sc.title,
            "unit": "MiB" if sc.idle else "msgs/s",
            "metric": "broker RSS growth" if sc.idle else "deliveries per second to subscribers",
            "higher_is_better": not sc.idle,
            "results": {b: _cell(o) for b, o in cells.items()},
            "ratios": {f"ours/{p}": _ratio(cells.get("ours"), cells.get(p)) for p in PEERS
                       if "ours" in cells and p in cells},
        }
    return out


def write_json(data: dict[str, Any], path: Path) -> None:
    """Write atomically (tmp file + rename) so a killed run never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def finish(env: dict[str, Any], results: dict[str, dict[str, Any]], path: Path,
           started: float, summary: Callable[[dict[str, Any]], str]) -> None:
    """A side-by-side run's end: the environment's closing load and run time, the JSON, and
    one `summary` line a broker (startup_bench.py, offline_bench.py)."""
    env["loadavg_at_end"] = os.getloadavg()[0]
    env["total_runtime_s"] = round(time.monotonic() - started, 1)
    write_json({"environment": env, "results": results}, path)
    print()
    for name, cell in results.items():
        print(f"{name:10} {summary(cell)}")
    print(f"\nwrote {path} in {env['total_runtime_s']}s")


def _fmt(outcome: Outcome | None) -> str:
    if outcome is None:
        return "-"
    if not outcome.ok or outcome.value is None:
        return "FAILED"
    text = f"{outcome.value:,.1f}" if outcome.unit == "MiB" else f"{outcome.value:,.0f}"
    return text if outcome.verified else text + " *"


def align(rows: list[list[str]]) -> list[str]:
    """Rows of cells as text columns: the first left-aligned (labels), the others
    right-aligned (figures), a rule under the header row."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                  for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def table(scenarios: list[Scenario], brokers: list[str],
          outcomes: dict[tuple[str, str], Outcome]) -> str:
    ratio_cols = [p for p in PEERS if "ours" in brokers and p in brokers]
    header = ["scenario", *brokers, *(f"ours/{p}" for p in ratio_cols)]
    rows = [header]
    notes: list[str] = []
    for sc in scenarios:
        unit = "MiB, lower is better" if sc.idle else "msgs/s"
        row = [f"{sc.key}) {sc.name} ({unit})"]
        for b in brokers:
            o = outcomes.get((sc.name, b))
            row.append(_fmt(o))
            if o and not o.ok:
                notes.append(f"{sc.name}/{b}: {(o.error or '').splitlines()[0][:200]}")
            elif o and not o.verified:
                d = o.details
                what = (f"connected {d.get('connected')}, dropped {d.get('dropped_by_broker')}"
                        if sc.idle else
                        f"lost {d.get('lost')}, duplicates {d.get('duplicates')}, "
                        f"unacked {d.get('unacked_by_broker')}")
                notes.append(f"{sc.name}/{b}: counts do not add up: {what}")
        for p in ratio_cols:
            r = _ratio(outcomes.get((sc.name, "ours")), outcomes.get((sc.name, p)))
            row.append("-" if r is None else f"{r:.2f}x")
        rows.append(row)
    lines = align(rows)
    if notes:
        lines += ["", "* / FAILED:", *(f"  {n}" for n in notes)]
    busy = max((o.details.get("other_cpu", 0.0) for o in outcomes.values()), default=0.0)
    if busy > BUSY_MACHINE:
        lines += ["", f"warning: other processes kept up to {busy:.1f} CPUs busy during the "
                  "measurement windows (other_cpu in results.json): numbers are depressed and "
                  "noisy; rerun on a quiet machine"]
    return "\n".join(lines)


README_ROWS = {
    "qos0_1to1": "a) QoS 0, 1 -> 1 (msgs/s)",
    "qos1_1to1": "b) QoS 1, 1 -> 1 (msgs/s)",
    "qos0_fanout100": "c) QoS 0 fan-out 1 -> 100 (deliveries/s)",
    "qos1_fanin100": "d) QoS 1 fan-in 100 -> 1 (msgs/s)",
}
"""The README's throughput rows, by scenario name: the table it shows is `readme_table`'s."""


def readme_table(data: dict[str, Any]) -> str:
    """The README's throughput table rendered from a results JSON (run.py's, scenarios a-d
    with all three brokers), so the figures the README shows are the JSON's and nothing
    typed by hand (tests/docs/test_docs_honest.py compares the two)."""
    lines = ["| scenario | ours | Mosquitto | amqtt | ours/Mosquitto | ours/amqtt |",
             "|---|---|---|---|---|---|"]
    for name, label in README_ROWS.items():
        scenario = data["scenarios"][name]
        rates = [f"{scenario['results'][b]['value']:,.0f}" for b in ("ours", *PEERS)]
        ratios = [f"{scenario['ratios'][f'ours/{p}']:.{2 if p == 'mosquitto' else 1}f}x"
                  for p in PEERS]
        lines.append("| " + " | ".join([label, *rates, *ratios]) + " |")
    return "\n".join(lines)


def detail_lines(outcome: Outcome) -> str:
    """One line per finished cell while the run is going, so progress is visible."""
    if not outcome.ok:
        return f"  {outcome.broker:<10} FAILED: {(outcome.error or '').splitlines()[0][:300]}"
    d = outcome.details
    if outcome.unit == "MiB":
        return (f"  {outcome.broker:<10} +{outcome.value:,.1f} MiB RSS for {d['connected']} conns"
                f" ({d['kib_per_connection']:.1f} KiB/conn, {d['connects_per_s']:,.0f} conn/s,"
                f" dropped {d['dropped_by_broker']})")
    return (f"  {outcome.broker:<10} {d['deliveries_per_s']:>12,.0f} deliveries/s"
            f"  (in {d['published_per_s']:,.0f} msgs/s; broker CPU {d['broker_cpu']:.0%},"
            f" generator CPU {d['generator_cpu']:.0%}, other load {d['other_cpu']:.0%};"
            f" lost {d['lost']},"
            f" dup {d['duplicates']}{', slow path' if d['slow_path'] else ''})")
