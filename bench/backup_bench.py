"""Backup benchmark (issue 39): how fast `broker ctl data export` and `import` go against
`tar` of a stopped node's data dir, and what an export running costs QoS 1 publishers.

    PYTHONPATH=. .venv/bin/python bench/backup_bench.py [--megabytes N] [--quick]

One node (builtin_local, the defaults), a process on this machine, on loopback. It is filled
with N MiB of 4 KiB QoS 1 messages for an offline durable session (sealed half way, so the
archive holds sealed generations as their files and current ones read through a LevelDB
snapshot); then (see bench/README.md, "Backup benchmark"):

- export: `broker ctl data export` (the node streams the archive over HTTP; the CLI checks
  it as it arrives, writes it, fsyncs it and renames it), against `tar cf` of the same
  data dir with the node stopped (then `sync`), each as the data dir's bytes (without the
  free-space reserve, `ds/reserve.bin`, which neither takes) per second;
- import: `broker ctl data import` into a fresh node (the upload, every checksum, the
  restore), against `tar xf` of that tar (then `sync`);
- publishers: PUB_CLIENTS pipelined QoS 1 publishers (WINDOW in flight each) on a durable
  topic for WINDOW_S seconds without an export, then as long with exports back to back: the
  acknowledgements per second of each window.
Each is done `--rounds` times (3) and the medians compared (the machine's speed moves
within minutes): tar and untar with the node stopped, then exports of the same data with it
running again, the publishers' pairs (which add data: after the exports), and imports of
the archive into fresh nodes.
Writes bench/backup_results.json.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report, wire
from broker.ds.space import tree_bytes
from tests.support.broker_process import BrokerProcess

RESULTS = Path(__file__).resolve().parent / "backup_results.json"
PAYLOAD = os.urandom(4096)
TOPIC = "bench/backup"
WINDOW = 64  # QoS 1 PUBLISHes in flight per publisher
PUB_CLIENTS = 2
WINDOW_S = 10.0
RESERVE = "ds/reserve.bin"


class Publisher(threading.Thread):
    """Pipelined QoS 1: WINDOW in flight, one more sent per PUBACK; counts PUBACKs."""

    def __init__(self, port: int, client_id: str, limit: int | None = None) -> None:
        super().__init__(daemon=True)
        self.port, self.client_id, self.limit = port, client_id, limit
        self.acked = 0
        self.stop = threading.Event()

    def run(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(wire.connect(self.client_id))
        wire.recv_exact(sock, wire.CONNACK_SIZE)
        sent = 0
        try:
            while not self.stop.is_set() and (self.limit is None or self.acked < self.limit):
                while sent - self.acked < WINDOW and (self.limit is None or sent < self.limit):
                    sock.sendall(wire.publish(TOPIC, PAYLOAD, 1, sent % 65535 + 1))
                    sent += 1
                wire.recv_exact(sock, 4)  # a PUBACK
                self.acked += 1
        finally:
            sock.close()


def publish(port: int, count: int, tag: str) -> None:
    publishers = [Publisher(port, f"{tag}-{n}", count // PUB_CLIENTS) for n in range(PUB_CLIENTS)]
    for p in publishers:
        p.start()
    for p in publishers:
        p.join()


def rate(port: int, tag: str, during: threading.Event | None = None) -> float:
    publishers = [Publisher(port, f"{tag}-{n}") for n in range(PUB_CLIENTS)]
    for p in publishers:
        p.start()
    time.sleep(1.0)  # connected and flowing
    start_acked, started = sum(p.acked for p in publishers), time.monotonic()
    time.sleep(WINDOW_S)
    acked, elapsed = sum(p.acked for p in publishers) - start_acked, time.monotonic() - started
    for p in publishers:
        p.stop.set()
    for p in publishers:
        p.join(30)
    if during is not None:
        during.set()
    return acked / elapsed


def settled() -> None:
    """Untimed, before each timed step: what earlier steps left dirty in the page cache
    written out. An fsync commits ext4's journal, which writes out every file's dirty data
    of that commit: without this, the first import after the publishers' phase paid for the
    hundreds of MiB of exports that phase wrote, and each `tar` step for the one before."""
    subprocess.run(["sync"], check=True)


def ctl(*args: str) -> float:
    settled()
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "broker", "ctl", "data", *args], check=True,
                   capture_output=True, timeout=3600)
    return time.monotonic() - started


def timed(argv: list[str]) -> float:
    settled()
    started = time.monotonic()
    subprocess.run(argv, check=True, timeout=3600)
    subprocess.run(["sync"], check=True)
    return time.monotonic() - started


def subscribe_durable(port: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(wire.connect("bench-durable", clean=False))
    wire.recv_exact(sock, wire.CONNACK_SIZE)
    sock.sendall(wire.subscribe("bench/#", 1))
    wire.recv_exact(sock, 5)  # SUBACK
    sock.close()


def post(node: BrokerProcess, path: str) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{node.ports['http']}{path}", b"",
                                     method="POST")
    urllib.request.urlopen(request, timeout=60).close()


def export_loop(url: str, file: Path, done: threading.Event, count: list[int]) -> None:
    """Exports back to back until `done`."""
    while not done.is_set():
        ctl("export", str(file), "--url", url)
        count[0] += 1


def median(values: list[float]) -> float:
    return statistics.median(values)


def run(megabytes: int, rounds: int, tmp: Path) -> dict[str, Any]:
    """Tar rounds on the stopped node's data, export rounds on the same data once it runs
    again, then the publishers' pairs (which add data: last), then import rounds."""
    settings = {"durable_sessions.enable": "true"}
    machine = report.machine()
    source = BrokerProcess(tmp / "source", dict(settings)).start()
    try:
        subscribe_durable(source.tcp)
        count = megabytes * 1024 * 1024 // len(PAYLOAD)
        publish(source.tcp, count // 2, "fill-a")
        post(source, "/api/v5/ds/storages/messages/generations")  # seal
        publish(source.tcp, count - count // 2, "fill-b")
    finally:
        source.stop(120)
    tars, untars = [], []
    tar_file = tmp / "datadir.tar"
    for n in range(rounds):
        tars.append(timed(["tar", "cf", str(tar_file), f"--exclude=./{RESERVE}", "-C",
                           str(source.data_dir), "."]))
        untar_dir = tmp / f"untar{n}"
        untar_dir.mkdir()
        untars.append(timed(["tar", "xf", str(tar_file), "-C", str(untar_dir)]))
        shutil.rmtree(untar_dir)
    # What a backup of the node is about: not the reserve Durable Storage keeps against a
    # full disk (space.py), which neither the archive nor the tar takes.
    data_bytes = tree_bytes(source.data_dir) - (source.data_dir / RESERVE).stat().st_size
    archive = tmp / "backup.tar"
    exports: list[float] = []
    pairs: list[tuple[float, float, int]] = []
    source.start()
    try:
        url = f"http://127.0.0.1:{source.ports['http']}"
        for _ in range(rounds):
            exports.append(ctl("export", str(archive), "--url", url))
        verify_s = ctl("verify", str(archive))
        for n in range(rounds):
            baseline = rate(source.tcp, f"base{n}")
            done, looped = threading.Event(), [0]
            looping = threading.Thread(target=export_loop, daemon=True,
                                       args=(url, tmp / "during.tar", done, looped))
            looping.start()
            during = rate(source.tcp, f"during{n}", done)
            looping.join(600)
            pairs.append((baseline, during, looped[0]))
    finally:
        source.stop(120)
    imports = []
    for n in range(rounds):
        target = BrokerProcess(tmp / f"target{n}", dict(settings)).start()
        try:
            imports.append(ctl("import", str(archive), "--url",
                               f"http://127.0.0.1:{target.ports['http']}"))
        finally:
            target.stop(120)
        shutil.rmtree(target.data_dir)
    mib = data_bytes / 2**20
    export_s, tar_s, import_s, untar_s = map(median, (exports, tars, imports, untars))
    return {
        "environment": {**machine, "shared_machine": True,
                        "loadavg_at_end": os.getloadavg()[0],
                        "note": "2 cores shared with other sessions' work: see loadavg"},
        "rounds": rounds, "data_dir_mib": round(mib, 1),
        "archive_mib": round(archive.stat().st_size / 2**20, 1),
        "messages": count, "payload_bytes": len(PAYLOAD),
        "export": {"seconds": round(export_s, 2), "mib_per_s": round(mib / export_s, 1),
                   "rounds_s": [round(x, 2) for x in exports],
                   "includes": "the CLI's start, HTTP stream checked as it arrives, fsync"},
        "verify": {"seconds": round(verify_s, 2)},
        "tar_c": {"seconds": round(tar_s, 2), "mib_per_s": round(mib / tar_s, 1),
                  "rounds_s": [round(x, 2) for x in tars]},
        "export_vs_tar": round(tar_s / export_s, 2),
        "import": {"seconds": round(import_s, 2), "mib_per_s": round(mib / import_s, 1),
                   "rounds_s": [round(x, 2) for x in imports],
                   "includes": "the CLI's start, upload, checked unpack, restore"},
        "tar_x": {"seconds": round(untar_s, 2), "mib_per_s": round(mib / untar_s, 1),
                  "rounds_s": [round(x, 2) for x in untars]},
        "import_vs_tar": round(untar_s / import_s, 2),
        "publishers": {
            "clients": PUB_CLIENTS, "window": WINDOW, "seconds": WINDOW_S,
            "pairs": [{"without_export_per_s": round(b), "during_export_per_s": round(d),
                       "exports_during": x, "ratio": round(d / b, 2)} for b, d, x in pairs],
            "ratio_median": round(median([d / b for b, d, _ in pairs]), 2)},
        "targets": {"export_vs_tar": 0.5, "import_vs_tar": 0.5, "publishers_ratio": 0.8},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="32 MiB, one round")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="backup-bench-") as tmp:
        results = run(32 if args.quick else args.megabytes, 1 if args.quick else args.rounds,
                      Path(tmp))
    report.write_json(results, args.output)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
