"""Retained QoS 1 publish rate of one broker node, acknowledged (PUBACK received) per second.

    .venv/bin/python bench/retained_rate.py [--clients 4] [--window 100] [--duration 5]
                                            [--topics 1000]

Starts a single node (`make run`'s shape: manual discovery, `durable_storage.n_sites` 1) in a
temporary data dir. Each client keeps `window` retained QoS 1 PUBLISHes of 64 bytes
outstanding (MQTT 3.1.1: no Receive Maximum; the broker's own flow control applies) over
`topics` topics of its own, so the retained set grows to clients x topics. Counts PUBACKs
over `duration` seconds after a one-second warm-up: the rate and the acknowledgement latency
p50/p99. Since retained messages go through the node's Raft group, a PUBACK waits for the
write-ahead log's fdatasync; before, it waited for nothing.
"""

import argparse
import asyncio
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `broker` and `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.broker_process import BrokerProcess

_PAYLOAD = b"x" * 64


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def _packet(first: int, body: bytes) -> bytes:
    length, encoded = len(body), bytearray()
    while True:
        byte, length = length % 128, length // 128
        encoded.append(byte | (0x80 if length else 0))
        if not length:
            return bytes([first]) + bytes(encoded) + body


def _connect(client_id: str) -> bytes:
    return _packet(0x10, _string("MQTT") + bytes([4, 0x02]) + struct.pack(">H", 60)
                   + _string(client_id))


def _publish(topic: str, packet_id: int) -> bytes:
    return _packet(0x33, _string(topic) + struct.pack(">H", packet_id) + _PAYLOAD)


async def _client(port: int, number: int, window: int, topics: int, stop: float,
                  measure_from: float, latencies: list[float]) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_connect(f"bench-{number}"))
    await reader.readexactly(4)  # CONNACK
    sent: dict[int, float] = {}
    acked = 0
    next_id = 1
    sequence = 0

    def send_one() -> None:
        nonlocal next_id, sequence
        packet_id = next_id
        next_id = next_id % 65535 + 1
        sent[packet_id] = time.perf_counter()
        writer.write(_publish(f"bench/{number}/{sequence % topics}", packet_id))
        sequence += 1

    for _ in range(window):
        send_one()
    while time.perf_counter() < stop:
        header = await reader.readexactly(4)  # PUBACK: 0x40 0x02 id
        (packet_id,) = struct.unpack_from(">H", header, 2)
        now = time.perf_counter()
        started = sent.pop(packet_id)
        if now >= measure_from:
            acked += 1
            latencies.append(now - started)
        send_one()
    writer.close()
    return acked


async def _run(port: int, clients: int, window: int, topics: int, duration: float
               ) -> tuple[int, list[float]]:
    start = time.perf_counter()
    measure_from = start + 1.0
    latencies: list[float] = []
    counts = await asyncio.gather(*(
        _client(port, number, window, topics, measure_from + duration, measure_from,
                latencies) for number in range(clients)))
    return sum(counts), latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--topics", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="retained-rate-") as data_dir:
        broker = BrokerProcess(Path(data_dir)).start()
        try:
            acked, latencies = asyncio.run(_run(broker.tcp, args.clients, args.window,
                                                args.topics, args.duration))
        finally:
            broker.stop()
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99)] if latencies else 0.0
    print(f"{acked / args.duration:,.0f} retained QoS 1 PUBLISH/s acknowledged"
          f" ({args.clients} clients x window {args.window}, {args.duration:.0f} s);"
          f" latency p50 {statistics.median(latencies) * 1000:.1f} ms,"
          f" p99 {p99 * 1000:.1f} ms")


if __name__ == "__main__":
    main()
