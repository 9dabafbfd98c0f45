"""CPU cost of one message through the broker's hot path, in process, without sockets.

Why: socket benchmarks on a shared 2-core machine swing by 2x with other load, which hides
a 10% change. This drives real `Connection` objects (codec, handlers, router, sessions,
output batching) with pre-encoded bytes and counts CPU time per message, so an optimisation
can be judged in seconds and profiled (`py-spy record -- python bench/pathcost.py`).
It complements the side-by-side run in `run.py`; it does not replace it.

`--durable` makes the subscriber a persistent session (3.1.1, clean session 0): each message
is then stored in Durable Storage, read back, recorded in the session's state and
acknowledged there, with real LevelDB files; CPU time counts every thread of the process, so
LevelDB's share is in the figure. The harness waits for each read's messages to arrive before
it acknowledges them, so batches are `--batch` long (the socket benchmark's are longer).

`--set KEY=VALUE` (repeatable) changes a setting, e.g. `authorization.acl_file=FILE` to see
what the ACL costs per message (bench/security_bench.py makes a 100-rule file).

Usage: .venv/bin/python bench/pathcost.py [--qos 0|1] [--durable] [--messages N] [--batch N]
                                          [--repeat N] [--set KEY=VALUE ...]
"""

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import wire
from broker.config.loader import load_config
from broker.mqtt.codec import encode
from broker.mqtt.packets import Puback
from broker.node import Node
from broker.server.connection import Connection
from broker.server.output import OutputBatch
from tests.support.transport import RecordingTransport


def _count_publishes(chunks: list[bytes], size: int) -> int:
    return sum(len(chunk) for chunk in chunks) // size


class _NotifyingTransport(RecordingTransport):
    """Wakes the harness when the broker writes (durable deliveries arrive on later loop
    turns, after their batch record is on disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.wrote = asyncio.Event()

    def write(self, data: bytes) -> None:
        super().write(data)
        self.wrote.set()


def _pair(node: Node, sub_t: RecordingTransport, qos: int,
          clean: bool = True) -> tuple[Connection, Connection, RecordingTransport]:
    """A subscriber to bench/t on `sub_t` and a publisher, both connected through real
    `Connection`s sharing one output batch; the subscriber's CONNACK and SUBACK are left for
    `_suback`, the publisher's CONNACK is cleared."""
    output = OutputBatch(asyncio.get_running_loop())
    pub_t = RecordingTransport()
    sub, pub = Connection(node, sub_t, output), Connection(node, pub_t, output)
    sub.data_received(wire.connect("sub", clean=clean) + wire.subscribe("bench/t", qos))
    pub.data_received(wire.connect("pub"))
    pub_t.writes.clear()
    return sub, pub, pub_t


async def _suback(sub_t: _NotifyingTransport) -> None:
    """Waits for the subscriber's SUBACK and clears what came up to it. A durable
    subscription's comes once it is stored; any comes after the CONNACK, which a CONNECT
    may send on a later loop turn (its held input, the SUBSCRIBE, waits for it). Left in
    place, it would share a write with the first deliveries and shift every packet the
    harness acknowledges by its 5 bytes (then nothing more comes)."""
    while True:
        data, at = b"".join(sub_t.writes), 0
        while at + 1 < len(data):  # small packets: a one-byte remaining length
            if data[at] >> 4 == 9:  # SUBACK
                sub_t.writes.clear()
                return
            at += 2 + data[at + 1]
        sub_t.wrote.clear()
        await sub_t.wrote.wait()


async def measure_durable(messages: int, batch: int,
                          settings: Sequence[str] = ()) -> float:
    """Microseconds of CPU per message into a persistent session: publisher read, storage,
    read-back, batch record, delivery, subscriber acknowledgement and its record."""
    with tempfile.TemporaryDirectory() as data_dir:
        config = load_config(None, [f"node.data_dir={data_dir}", "retainer.enable=false",
                                    *settings])
        node = Node(config)
        assert node.ds is not None
        node.ds.start()
        sub_t = _NotifyingTransport()
        sub, pub, pub_t = _pair(node, sub_t, 1, clean=False)
        await _suback(sub_t)
        payload = bytes(100)
        layout = wire.publish_layout("bench/t", payload, 1)
        chunk = b"".join(wire.publish("bench/t", payload, 1, i + 1) for i in range(batch))
        offset = layout.id_offset
        assert offset is not None
        delivered = 0
        started = time.process_time()
        while delivered < messages:
            pub.data_received(chunk)
            arrived = 0
            while arrived < batch:  # acknowledged as they come: the in-flight window is small
                if not sub_t.writes:
                    sub_t.wrote.clear()
                    await sub_t.wrote.wait()
                data = b"".join(sub_t.writes)
                sub_t.writes.clear()
                arrived += len(data) // layout.size
                sub.data_received(wire.pubacks_for(data[offset::layout.size],
                                                   data[offset + 1::layout.size]))
            pub_t.writes.clear()
            delivered += batch
        elapsed = time.process_time() - started
        await node.ds.close()
        node.close()
        return elapsed / delivered * 1e6


async def measure(qos: int, messages: int, batch: int, settings: Sequence[str] = ()) -> float:
    """Microseconds of CPU per message, publisher read to subscriber acknowledgement."""
    with tempfile.TemporaryDirectory() as data_dir:
        config = load_config(None, [f"node.data_dir={data_dir}", "retainer.enable=false",
                                    *settings])
        node = Node(config)
        sub_t = _NotifyingTransport()
        sub, pub, pub_t = _pair(node, sub_t, qos)
        await _suback(sub_t)
        payload = bytes(100)
        chunk = b"".join(
            wire.publish("bench/t", payload, qos, (i % 65535) + 1) for i in range(batch)
        )
        publish_size = len(wire.publish("bench/t", payload, qos, 1 if qos else None))
        acks = [encode(Puback(i), wire.MQTT_V311) for i in range(1, 65536)]
        next_ack = 0
        delivered = 0
        started = time.process_time()
        while delivered < messages:
            pub.data_received(chunk)
            got = _count_publishes(sub_t.writes, publish_size)
            if not got:  # the loop never yields: a stalled path would spin here for ever
                raise RuntimeError(f"a batch of {batch} PUBLISHes delivered nothing")
            sub_t.writes.clear()
            pub_t.writes.clear()
            delivered += got
            if qos:
                # Acknowledge what arrived; ids run 1..65535 in order, as the broker assigns them.
                ids = [(next_ack + i) % 65535 for i in range(got)]
                next_ack = (next_ack + got) % 65535
                sub.data_received(b"".join(acks[i] for i in ids))
                more = _count_publishes(sub_t.writes, publish_size)
                sub_t.writes.clear()
                while more:
                    ids = [(next_ack + i) % 65535 for i in range(more)]
                    next_ack = (next_ack + more) % 65535
                    delivered += more
                    sub.data_received(b"".join(acks[i] for i in ids))
                    more = _count_publishes(sub_t.writes, publish_size)
                    sub_t.writes.clear()
        elapsed = time.process_time() - started
        node.close()
        return elapsed / delivered * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qos", type=int, default=1, choices=(0, 1))
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=32, help="PUBLISHes per publisher read")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--durable", action="store_true",
                        help="QoS 1 into a persistent session (Durable Storage on disk)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a configuration setting (repeatable)")
    args = parser.parse_args()
    costs = [asyncio.run(measure_durable(args.messages, args.batch, args.set) if args.durable
                         else measure(args.qos, args.messages, args.batch, args.set))
             for _ in range(args.repeat)]
    best = min(costs)
    kind = "durable QoS 1" if args.durable else f"QoS {args.qos}"
    print(f"{kind}, {args.batch} per read: {best:.2f} us CPU per message "
          f"(best of {args.repeat}; {1e6 / best:,.0f} msgs/s on one core, no syscalls)")


if __name__ == "__main__":
    main()
