"""Offline sessions benchmark (issue 42 item 4): what many offline persistent sessions cost a
broker, in memory and at a restart, and how fast they all come back at once; ours against
Mosquitto with persistence.

    .venv/bin/python bench/offline_bench.py [--sessions N] [--concurrency C]
                                            [--topic own|same] [--brokers ours,mosquitto]

Per broker, on a fresh process with the durable_bench.py persistent configuration:
  create:  N clients (MQTT 3.1.1, clean session 0) each subscribe to one QoS 1 filter
           (`own`: its own topic `offline/<id>/cmd`; `same`: all to `offline/all`) and leave
           with a DISCONNECT, C handshakes in flight per generator process (storm.py):
           RSS growth per session once the broker settled (VmRSS, and its anonymous
           part RssAnon: the heap, not the file pages of LevelDB's tables).
  restart: SIGTERM, then a start on the same data: seconds from the new process's start
           to its listener accepting TCP, and to its first CONNACK; RSS per session then.
  storm:   all N clients reconnect at once (C in flight per process, two processes):
           connections/s from the first CONNACK to the last, clients refused (must be 0),
           and Session Present 1 for each; RSS per session after they all left again.
Writes bench/offline_results.json; the load average is recorded with each broker's cell.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, procstat, report
from bench.scenarios import settled_rss
from bench.storm import StormSpec, storm

RESULTS = Path(__file__).resolve().parent / "offline_results.json"
ALL_BROKERS = ("ours", "mosquitto")
TOPICS = {"own": "offline/{id}/cmd", "same": "offline/all"}
PROCS = 2
POLL = 0.005


def _ids(sessions: int) -> list[str]:
    return [f"offline-{i:07d}" for i in range(sessions)]


def _storm(broker: brokers.Running, ids: list[str], topic: str | None,
           concurrency: int) -> dict[str, Any]:
    specs = [StormSpec(broker.port, ids[i::PROCS], topic, 1, concurrency) for i in range(PROCS)]
    result, seconds = storm(specs, brokers.load_cpus())
    return {"acknowledged": result.acknowledged, "present": result.present,
            "refused": result.refused, "errors": list(result.errors),
            "seconds": round(seconds, 3),
            "connections_per_s": round(result.acknowledged / seconds) if seconds else None}


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _restart(broker: brokers.Running) -> dict[str, float]:
    """SIGTERM, then a start: seconds to the listener accepting TCP, to the first CONNACK."""
    started = time.monotonic()
    brokers.stop(broker, signal.SIGTERM, 300.0)
    stopped = time.monotonic()
    brokers.respawn(broker)
    listening = connack = 0.0
    deadline = stopped + brokers.READY_TIMEOUT * 4
    while not connack:
        if time.monotonic() > deadline or not broker.alive():
            raise brokers.BrokerUnavailable(f"no CONNACK after the restart:\n"
                                            f"{broker.log_tail()}")
        if not listening and _listening(broker.port):
            listening = time.monotonic() - stopped
        if listening and brokers.probe(broker.port, "bench-offline-probe"):
            connack = time.monotonic() - stopped
        time.sleep(POLL)
    return {"stop_s": round(stopped - started, 3), "listening_s": round(listening, 3),
            "first_connack_s": round(connack, 3),
            # On a shared machine a start mostly waits for a core: its CPU is steadier.
            "first_connack_cpu_s": round(procstat.cpu_seconds(broker.pid), 3)}


def _offloaded(broker: brokers.Running, sessions: int) -> None:
    """Ours: waits until every session left memory (its gauge), so RSS is measured then."""
    if broker.name != "ours":
        return
    deadline = time.monotonic() + 120
    url = f"http://127.0.0.1:{broker.http_port}/metrics"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
        except urllib.error.URLError:  # the HTTP listener comes up after MQTT's
            text = ""
        for line in text.splitlines():
            if line.startswith("mqtt_durable_sessions_offloaded ") and \
                    float(line.split()[1]) >= sessions:
                return
        time.sleep(0.2)
    raise TimeoutError("the sessions did not all leave memory within 120 s")


def _per_session(rss_kib: int, base_kib: int, sessions: int) -> float:
    return round((rss_kib - base_kib) * 1024 / sessions)


def _anon(broker: brokers.Running) -> int:
    """RssAnon, KiB: the heap's part of VmRSS (not the pages of LevelDB's tables)."""
    return procstat.rss_kib(broker.pid, "RssAnon")


def run(name: str, sessions: int, topic: str, concurrency: int) -> dict[str, Any]:
    ids = _ids(sessions)
    with brokers.running(name, persistent=True) as broker:
        base = settled_rss(broker.pid)
        base_anon = _anon(broker)
        created = _storm(broker, ids, topic, concurrency)
        _offloaded(broker, sessions)
        created_rss = settled_rss(broker.pid)
        created_anon = _anon(broker)
        restarted = _restart(broker)
        _offloaded(broker, sessions)
        restarted_rss = settled_rss(broker.pid)
        load = os.getloadavg()[0]
        stormed = _storm(broker, ids, None, concurrency)
        _offloaded(broker, sessions)
        after_rss = settled_rss(broker.pid)
    return {
        "create": created, "base_rss_kib": base,
        "rss_bytes_per_session": _per_session(created_rss, base, sessions),
        "rss_mib": round(created_rss / 1024, 1),
        "base_rss_anon_kib": base_anon,
        "rss_anon_bytes_per_session": _per_session(created_anon, base_anon, sessions),
        "restart": restarted,
        "rss_bytes_per_session_after_restart": _per_session(restarted_rss, base, sessions),
        "storm": stormed,
        "rss_bytes_per_session_after_storm": _per_session(after_rss, base, sessions),
        "loadavg_at_restart": round(load, 2),
        "verified": stormed["refused"] == 0 and stormed["present"] == sessions
        and created["acknowledged"] == sessions,
    }


def _summary(cell: dict[str, Any]) -> str:
    restart, stormed = cell["restart"], cell["storm"]
    return (f"{cell['rss_bytes_per_session']:,} B of RSS a session ({cell['rss_mib']} MiB),"
            f" restart: listening {restart['listening_s']} s, first CONNACK"
            f" {restart['first_connack_s']} s; storm {stormed['connections_per_s']:,}"
            f" connections/s, {stormed['refused']} refused, {stormed['present']:,} resumed")


def _compiled_modules() -> int:
    """How many of ours' modules its processes load compiled (0: pure Python): what
    `broker` imports under this environment, outside the repository (as the broker runs:
    PYTHONPATH may name another tree)."""
    done = subprocess.run([sys.executable, "-c", "import broker; print(broker.COMPILED_MODULES)"],
                          cwd="/", capture_output=True, text=True, check=True)
    return int(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=500,
                        help="handshakes in flight per generator process")
    parser.add_argument("--topic", choices=sorted(TOPICS), default="own")
    brokers.add_arguments(parser, ALL_BROKERS, RESULTS)
    args = parser.parse_args(argv)
    names = brokers.chosen(args, ALL_BROKERS)
    versions = {name: brokers.version(name) for name in names}
    print(f"brokers: {versions}; load average {os.getloadavg()[0]:.2f}", flush=True)
    env: dict[str, Any] = {
        **report.machine(), "broker_versions": versions,
        "broker_cpu_pinned": brokers.BROKER_CPU if brokers.pinned() else None,
        "load_generator_cpus": sorted(brokers.load_cpus()),
        "ours_compiled_modules": _compiled_modules() if "ours" in names else None,
        "sessions": args.sessions, "topic": TOPICS[args.topic],
        "concurrency_per_process": args.concurrency, "generator_processes": PROCS}
    started = time.monotonic()
    results = {}
    for name in names:
        results[name] = cell = run(name, args.sessions, TOPICS[args.topic], args.concurrency)
        print(f"{name}: {cell}", flush=True)
    report.finish(env, results, args.output, started, _summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
