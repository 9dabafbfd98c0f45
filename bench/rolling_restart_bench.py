"""Rolling restart benchmark (issue 38): how long a QoS 1 publisher waits at most while the
three nodes of a cluster are restarted one after another, as a StatefulSet rolls its pods
(`helm upgrade`) or an operator upgrades them.

    .venv/bin/python bench/rolling_restart_bench.py [--rounds N] [--brokers ours,rabbitmq]

Per variant one fresh 3-node cluster on loopback (ours: `builtin_raft`, RF 3, 16 shards,
replication_bench.py's settings, with the graceful hand-over of Raft leadership and without
it; RabbitMQ: quorum queues); then `--rounds` times: the publisher (below) runs, every node
in turn from the last to the first gets SIGTERM, is started again on its data and the
cluster settles before the next; the figures are over the whole roll, from 1 s before the
first signal to 1 s after the last node settled (bench/README.md, "Rolling restart
benchmark").

The publisher is a client behind a load balancer: one persistent session (3.1.1, clean
session 0), one QoS 1 PUBLISH in flight, the next 1 ms after the previous was acknowledged,
to a topic an offline persistent session holds (so each PUBACK waits for a durable write);
when its connection closes it connects to the next node that answers and sends the
unacknowledged PUBLISH again (DUP). A message's wait runs from its first send to its
PUBACK, reconnection included: the longest is the stall the issue's target (< 2 s) is on.
Writes bench/rolling_restart_results.json.
"""

import argparse
import itertools
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `broker` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import brokers, report, wire
from bench.brokers import Running
from bench.replication_bench import (
    QUORUM,
    REPLICATED,
    durable_subscription,
    percentile,
    wait_led,
)
from broker.mqtt.packets import Puback

RESULTS = Path(__file__).resolve().parent / "rolling_restart_results.json"
TOPIC = "bench/rolling"
PAYLOAD = b"x" * 64
INTERVAL = 0.001
MARGIN = 1.0  # seconds recorded before the first signal and after the last settle
CONNECT_TIMEOUT = 10.0
VARIANTS = {  # name -> (broker, settings)
    "ours hand-over": ("ours", {**REPLICATED, "node.graceful_stop_timeout": "5s"}),
    "ours no-hand-over": ("ours", {**REPLICATED, "node.graceful_stop_timeout": "0"}),
    "rabbitmq": ("rabbitmq", QUORUM),
}


class Publisher(threading.Thread):
    """The reconnecting QoS 1 publisher of the module docstring; `samples` are (first send,
    PUBACK) times of messages first sent while `recording`."""

    def __init__(self, ports: list[int], client_id: str) -> None:
        super().__init__(daemon=True)
        self.ports, self.client_id = ports, client_id
        self.at = 0  # index in ports of the node connected to
        self.sock: socket.socket | None = None
        self.recording = False
        self.samples: list[tuple[float, float]] = []
        self.reconnects = 0
        self.error: BaseException | None = None
        self._done = threading.Event()

    def stop(self) -> None:
        self._done.set()
        self.join(CONNECT_TIMEOUT * len(self.ports) + 5)
        if self.sock is not None:
            self.sock.close()

    def _connect(self) -> socket.socket:
        """The next node that answers with a CONNACK, round the list until one does."""
        deadline = time.monotonic() + CONNECT_TIMEOUT * len(self.ports)
        while time.monotonic() < deadline and not self._done.is_set():
            port = self.ports[self.at % len(self.ports)]
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(wire.connect(self.client_id, clean=False))
                connack = wire.decode_one(wire.recv_exact(sock, wire.CONNACK_SIZE))
                if getattr(connack, "reason_code", 1) == 0:
                    return sock
                sock.close()
            except OSError:
                pass
            self.at += 1
            self._done.wait(0.01)
        raise ConnectionError("no node accepted the publisher")

    def run(self) -> None:
        try:
            self.sock = self._connect()
            n = 0
            while not self._done.is_set():
                packet_id = n % 65535 + 1
                first = time.monotonic()
                packet = wire.publish(TOPIC, PAYLOAD, 1, packet_id)
                while True:
                    try:
                        self.sock.sendall(packet)
                        reply = wire.decode_one(wire.recv_exact(self.sock, 4))
                        if not isinstance(reply, Puback) or reply.packet_id != packet_id:
                            raise ConnectionError(f"expected PUBACK {packet_id}, got {reply}")
                        break
                    except (OSError, ConnectionError, ValueError):
                        self.sock.close()
                        self.at += 1
                        self.reconnects += 1
                        self.sock = self._connect()
                        packet = wire.publish(TOPIC, PAYLOAD, 1, packet_id, dup=True)
                acked = time.monotonic()
                if self.recording:
                    self.samples.append((first, acked))
                n += 1
                self._done.wait(INTERVAL)
        except BaseException as exc:  # reported by the orchestrator
            self.error = exc


def settle(name: str, members: list[Running]) -> None:
    if name == "ours":
        wait_led(members)
    else:
        # Each member's rabbit app first: a node that answers MQTT may still be starting
        # its app (await_online_nodes then refuses, as seen at load 10).
        for member in members:
            brokers.rabbitmqctl(member, "await_startup")
        brokers.rabbitmqctl(members[0], "await_online_nodes", str(len(members)))


def roll(name: str, members: list[Running], round_: int) -> dict[str, Any]:
    durable_subscription(members[0].port, f"bench-rolling-sub-{round_}", TOPIC)
    publisher = Publisher([m.port for m in members], f"bench-rolling-pub-{round_}")
    publisher.start()
    publisher.recording = True
    time.sleep(MARGIN)
    started = time.monotonic()
    restarts = []
    for member in reversed(members):
        stop_s, ready_s = brokers.restart(member, signal.SIGTERM)
        settle(name, members)
        restarts.append({"node": member.node, "stop_s": round(stop_s, 3),
                         "ready_s": round(ready_s, 3)})
    rolled = time.monotonic()
    time.sleep(MARGIN)
    publisher.stop()
    if publisher.error is not None:
        raise RuntimeError(f"publisher failed: {publisher.error}")
    waits = [acked - sent for sent, acked in publisher.samples]
    if not waits:
        raise RuntimeError("no PUBACK during the roll")
    acks = sorted(acked for _, acked in publisher.samples)
    return {"roll_s": round(rolled - started, 2), "restarts": restarts,
            "publishes": len(waits), "reconnects": publisher.reconnects,
            "longest_wait_s": round(max(waits), 3),
            "longest_gap_s": round(max(b - a for a, b in itertools.pairwise(acks)), 3)
            if len(acks) > 1 else None,
            "p99_ms": round(percentile(waits, 99) * 1000, 1),
            "p50_ms": round(percentile(waits, 50) * 1000, 2)}


def run_variant(key: str, rounds: int) -> dict[str, Any]:
    name, settings = VARIANTS[key]
    started = time.monotonic()
    with brokers.running_cluster(name, 3, settings) as members:
        settle(name, members)
        print(f"{key}: up in {time.monotonic() - started:.1f}s", flush=True)
        cells = []
        for r in range(rounds):
            cells.append(roll(name, members, r))
            print(f"  roll {r + 1}: longest wait {cells[-1]['longest_wait_s']} s, p99"
                  f" {cells[-1]['p99_ms']} ms, {cells[-1]['reconnects']} reconnects,"
                  f" {cells[-1]['roll_s']} s", flush=True)
    return {"variant": key, "settings": settings, "rolls": cells,
            "longest_wait_max_s": max(c["longest_wait_s"] for c in cells),
            "p99_ms_max": max(c["p99_ms"] for c in cells),
            "runtime_s": round(time.monotonic() - started, 1)}


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| variant | longest wait, max of rolls (s) | p99 PUBACK, max of rolls (ms) "
            "| reconnects per roll | roll of 3 nodes (s) |", "|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r['variant']} | {r['longest_wait_max_s']} | {r['p99_ms_max']} "
                    f"| {', '.join(str(c['reconnects']) for c in r['rolls'])} "
                    f"| {', '.join(str(c['roll_s']) for c in r['rolls'])} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rolls per variant (3)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results JSON path")
    args = parser.parse_args(argv)
    keys = [key.strip() for key in args.variants.split(",")]
    env = {**report.machine(), "protocol": "MQTT 3.1.1", "rounds": args.rounds,
           "broker_versions": {VARIANTS[k][0]: brokers.version(VARIANTS[k][0]) for k in keys},
           "interval_s": INTERVAL, "margin_s": MARGIN}
    print(f"{args.rounds} roll(s) per variant; load average {os.getloadavg()[0]:.2f}",
          flush=True)
    results = []
    for key in keys:
        results.append(run_variant(key, args.rounds))
        report.write_json({"environment": env, "variants": results}, args.output)
    env["loadavg_at_end"] = os.getloadavg()[0]
    report.write_json({"environment": env, "variants": results}, args.output)
    print(f"\n{table(results)}\n\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
