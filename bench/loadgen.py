"""Load-generator worker processes: subscribers, publishers and idle-connection holders.

Why it looks like this: the machine has 2 cores and the broker gets one of them, so the whole
generator must fit in the other. Workers use blocking raw sockets multiplexed with epoll,
send only pre-encoded bytes (`wire.py`) and count replies with C-speed scans; no MQTT client
library, no asyncio. The orchestrator (`scenarios.py`) and the workers share a few integer
arrays in shared memory (`Shared`): a phase flag that the orchestrator moves forward and
per-worker counters that workers publish after each read or write, so the orchestrator can
sample delivery rates without talking to the workers.

Publishers are flow-controlled so no broker is pushed into unbounded queueing (which would turn
a throughput test into a memory test): a QoS 1 publisher keeps at most `window` PUBLISHes
unacknowledged per connection, and every publisher stops writing while the messages sent but not
yet delivered to subscribers exceed `max_lag` (QoS 0 counts a lag that does not shrink for
STALL_RESYNC seconds as lost, so a broker that drops messages does not stall the test).
"""

import contextlib
import os
import resource
import selectors
import socket
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import RawArray, RawValue
from typing import Any

from bench import wire
from bench.wire import Scanner
from broker.mqtt.packets import Puback

PREP, GO, STOP, DONE = 0, 1, 2, 3
"""Phases set by the orchestrator: connect and wait / publish / stop publishing and drain /
close everything."""

RECV_SIZE = 1 << 18
"""The most one read takes (a QoS 0 subscriber's reads fill it)."""
STALL_RESYNC = 2.0
COALESCE = 0.01
CONNECT_TIMEOUT = 10.0
DRAIN_TIMEOUT = 15.0
LATENCY_SAMPLES = 1 << 16
"""PUBLISH -> PUBACK times a publisher process keeps (the latest ones, in a ring)."""


class Shared:
    """Shared-memory counters, one slot per worker process; plain ints, no locks.

    Each slot has a single writer (its worker), so lock-free reads are at worst one update old.
    """

    def __init__(self, workers: int) -> None:
        self.phase: Any = RawValue("i", PREP)
        self.ready: Any = RawArray("i", workers)  # 1 = connected and set up, -1 = failed
        self.finished: Any = RawArray("i", workers)  # publishers: all PUBLISHes acknowledged
        self.sent: Any = RawArray("q", workers)  # PUBLISHes written by publishers
        self.acked: Any = RawArray("q", workers)  # PUBACKs received by publishers
        self.delivered: Any = RawArray("q", workers)  # PUBLISHes received by subscribers
        self.connected: Any = RawArray("q", workers)  # idle connections with a CONNACK
        self.dropped: Any = RawArray("q", workers)  # idle connections the broker closed
        self.slow_path: Any = RawArray("i", workers)  # a stream needed the full decoder
        self.resumed: Any = RawArray("q", workers)  # CONNACKs with Session Present
        self.mismatched: Any = RawArray("q", workers)  # connections that got != expected
        self.recording: Any = RawValue("i", 0)  # 1: QoS 1 publishers time PUBACKs
        self.latency: Any = RawArray("f", workers * LATENCY_SAMPLES)  # seconds, per slot
        self.latencies: Any = RawArray("q", workers)  # PUBACK times taken per slot

    def puback_seconds(self, slots: range) -> list[float]:
        """The PUBACK times the publishers in `slots` took while `recording`."""
        return [self.latency[slot * LATENCY_SAMPLES + i] for slot in slots
                for i in range(min(self.latencies[slot], LATENCY_SAMPLES))]


@dataclass(frozen=True, slots=True)
class SubscriberSpec:
    port: int
    client_ids: list[str]
    topic_filter: str | None  # None: resume a persistent session, which has it already
    qos: int
    layout: wire.Layout
    clean: bool = True  # False: persistent sessions, left with a DISCONNECT at the end
    expected: int = 0  # > 0: count connections that did not get exactly this many
    record: str | None = None
    """A file to write at the end: the identity (wire.IDENTITY) of every PUBLISH received,
    in order of arrival per connection (numbered publishers: PublisherSpec.identities)."""


@dataclass(frozen=True, slots=True)
class PublisherSpec:
    port: int
    client_ids: list[str]
    topics: list[str]  # one per connection
    payload: bytes
    qos: int
    subscribers: int  # total subscriber connections, to turn deliveries into per-sub progress
    max_lag: int  # messages sent but not yet received by every subscriber
    peers: int = 1  # publisher processes sharing max_lag
    window: int = 0  # QoS 1: unacknowledged PUBLISHes per connection
    chunk: int = 500  # QoS 0: messages per write
    total: int = 0  # QoS 1: stop after this many PUBLISHes per process (0: at phase STOP)
    identities: tuple[int, ...] = ()
    """QoS 1: each connection's publisher number; its payloads then start with their identity
    (wire.IDENTITY: that number and a sequence number from 0)."""


@dataclass(frozen=True, slots=True)
class IdleSpec:
    port: int
    client_ids: list[str]
    concurrency: int = 32  # handshakes in flight per process: stays under listen backlogs


Spec = SubscriberSpec | PublisherSpec | IdleSpec


def run_worker(spec: Spec, shared: Shared, slot: int, cpus: set[int], errors: Any) -> None:
    """Process entry point: pin to the load CPUs, raise the fd limit, run, report failures."""
    try:
        os.sched_setaffinity(0, cpus)
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        body: Callable[[Any, Shared, int], None]
        if isinstance(spec, SubscriberSpec):
            body = _subscriber
        elif isinstance(spec, PublisherSpec):
            body = _publisher_qos1 if spec.qos else _publisher_qos0
        else:
            body = _idle
        body(spec, shared, slot)
    except BaseException as exc:
        shared.ready[slot] = -1
        errors.put((slot, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"))


def _open(port: int, client_id: str, clean: bool = True) -> tuple[socket.socket, bool]:
    """A connected, CONNACK'ed blocking socket, and the CONNACK's Session Present."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(wire.connect(client_id, clean=clean))
    connack = wire.decode_one(wire.recv_exact(sock, wire.CONNACK_SIZE))
    if getattr(connack, "reason_code", 1) != 0:
        raise ConnectionError(f"CONNACK refused {client_id}: {connack}")
    sock.settimeout(None)  # from here on the orchestrator's phases and timeouts rule
    return sock, bool(getattr(connack, "session_present", False))


def _wait_phase(shared: Shared, phase: int) -> None:
    while shared.phase.value < phase:
        time.sleep(0.005)


def _subscriber(spec: SubscriberSpec, shared: Shared, slot: int) -> None:
    sel = selectors.DefaultSelector()
    resumed = 0
    for client_id in spec.client_ids:
        sock, present = _open(spec.port, client_id, spec.clean)
        resumed += present
        # Registered at once, so `_close_all` closes it also when the SUBACK check fails.
        sel.register(sock, selectors.EVENT_READ,
                     Scanner(spec.layout, ack=spec.qos > 0, record=spec.record is not None))
        if spec.topic_filter is None:
            continue
        sock.sendall(wire.subscribe(spec.topic_filter, spec.qos))
        suback = wire.decode_one(wire.recv_exact(sock, wire.SUBACK_SIZE))
        granted = getattr(suback, "reason_codes", [0x80])
        if granted != [spec.qos]:
            raise ConnectionError(f"SUBACK granted {granted}, wanted QoS {spec.qos}")
    shared.resumed[slot] = resumed
    shared.ready[slot] = 1
    total = 0
    inbox = Inbox()
    # QoS 0 fan-out reads are coalesced: a round of reads at most every COALESCE seconds lets
    # data pile up in the kernel, so 100 sockets cost a few large recv() calls instead of one
    # per packet. A single socket needs no help (under load each recv() returns a lot), and
    # QoS 1 subscribers answer at once: brokers cap unacknowledged deliveries (Mosquitto: 20).
    coalesce = COALESCE if not spec.qos and len(spec.client_ids) > 1 else 0.0
    try:
        while shared.phase.value != DONE:
            started = time.monotonic()
            for key, _ in sel.select(0.05):
                sock, scanner = key.fileobj, key.data
                data = inbox.recv(sock)
                if not data:
                    raise ConnectionError("broker closed a subscriber connection")
                before = scanner.count
                acks = scanner.feed(data)
                if acks:
                    sock.sendall(acks)  # type: ignore[union-attr]
                total += scanner.count - before
            shared.delivered[slot] = total
            if (pause := coalesce - (time.monotonic() - started)) > 0:
                time.sleep(pause)
        scanners = [key.data for key in sel.get_map().values()]
        shared.slow_path[slot] = int(any(s.slow_path for s in scanners))
        if spec.expected:
            shared.mismatched[slot] = sum(s.count != spec.expected for s in scanners)
        if spec.record is not None:
            with open(spec.record, "wb") as out:
                out.writelines(s.identities or b"" for s in scanners)
        if not spec.clean:
            for key in sel.get_map().values():
                with contextlib.suppress(OSError):  # counted already; closing anyway
                    key.fileobj.sendall(wire.DISCONNECT)  # type: ignore[union-attr]
    finally:
        _close_all(sel)


class Inbox:
    """Reads sockets into one buffer made once, and returns a copy of what arrived.

    Not `sock.recv(RECV_SIZE)`: CPython allocates RECV_SIZE bytes for each call and shrinks
    them to what came. 256 KiB is above glibc's mmap threshold (128 KiB, until the free of a
    larger mapped block raises it), so each read of a few PUBACKs cost an mmap, an mremap, a
    munmap and a page fault: in scenario d a quarter to a third of a publisher process's CPU
    (perf), and more or less from run to run as a large read did or did not happen to raise
    the threshold. The copy is of what arrived only.
    """

    __slots__ = ("_buffer", "_view")

    def __init__(self, size: int = RECV_SIZE) -> None:
        self._buffer = bytearray(size)
        self._view = memoryview(self._buffer)

    def recv(self, sock: socket.socket) -> bytes:
        return self._view[: sock.recv_into(self._buffer)].tobytes()


class _LagGate:
    """How many more messages a publisher may send before running too far ahead of delivery."""

    def __init__(self, shared: Shared, spec: PublisherSpec) -> None:
        self.shared = shared
        self.subscribers = spec.subscribers
        self.max_lag = spec.max_lag
        self.peers = spec.peers
        self.written_off = 0  # QoS 0: messages presumed lost by a stall resync
        self._last_delivered = -1
        self._since = time.monotonic()

    def lag(self) -> float:
        delivered = sum(self.shared.delivered) / self.subscribers
        return sum(self.shared.sent) - delivered - self.written_off

    def room(self) -> int:
        """This process's share of the free lag budget: shares of all peers add up to it.
        Without subscribers (publishing to offline sessions) there is nothing to lag
        behind: only the publisher's window limits it."""
        if not self.subscribers:
            return self.max_lag
        return (self.max_lag - int(self.lag())) // self.peers

    def resync_if_stalled(self) -> None:
        """QoS 0: a lag that has not shrunk for STALL_RESYNC seconds is counted as lost."""
        delivered = sum(self.shared.delivered)
        now = time.monotonic()
        if delivered != self._last_delivered:
            self._last_delivered, self._since = delivered, now
        elif now - self._since > STALL_RESYNC:
            self.written_off += max(0, int(self.lag()))
            self._since = now


def _publisher_qos0(spec: PublisherSpec, shared: Shared, slot: int) -> None:
    socks = [_open(spec.port, cid)[0] for cid in spec.client_ids]
    chunks = [wire.publish(topic, spec.payload, 0) * spec.chunk for topic in spec.topics]
    per_round = spec.chunk * len(socks)
    gate = _LagGate(shared, spec)
    shared.ready[slot] = 1
    try:
        _wait_phase(shared, GO)
        sent = 0
        while shared.phase.value == GO:
            if gate.room() < per_round:
                gate.resync_if_stalled()
                time.sleep(0.0005)
                continue
            for sock, chunk in zip(socks, chunks, strict=True):
                sock.sendall(chunk)
            sent += per_round
            shared.sent[slot] = sent
        shared.finished[slot] = 1
        _wait_phase(shared, DONE)
    finally:
        for sock in socks:
            sock.close()


def _publisher_qos1(spec: PublisherSpec, shared: Shared, slot: int) -> None:
    socks = [_open(spec.port, cid)[0] for cid in spec.client_ids]
    ids = max(1024, 4 * spec.window)  # packet ids in one pre-encoded cycle, > window
    payloads = ([wire.identified(spec.payload, n) for n in spec.identities]
                or [spec.payload] * len(socks))
    cycles = [memoryview(wire.publish_cycle(t, p, 1, ids))
              for t, p in zip(spec.topics, payloads, strict=True)]
    size = len(cycles[0]) // (2 * ids)
    payload_offset = size - len(spec.payload)
    low_water = spec.window - max(1, spec.window // 4)
    sel = selectors.DefaultSelector()
    scanners = [Scanner(wire.puback_layout(), ack=False, kind=Puback) for _ in socks]
    for i, sock in enumerate(socks):
        sel.register(sock, selectors.EVENT_READ, i)
    sent = [0] * len(socks)
    total_sent = total_acked = 0
    hungry = set(range(len(socks)))  # connections at or below the low-water mark
    gate = _LagGate(shared, spec)
    limit = spec.total or float("inf")
    timing: list[tuple[int, float] | None] = [None] * len(socks)  # (PUBACK count, sent at)
    inbox = Inbox()
    shared.ready[slot] = 1
    try:
        _wait_phase(shared, GO)
        deadline = None
        while shared.phase.value != DONE:
            sending = shared.phase.value == GO and total_sent < limit
            if sending and hungry and (room := min(gate.room(), limit - total_sent)) > 0:
                for i in list(hungry):
                    k = min(spec.window - (sent[i] - scanners[i].count), room)
                    start = (sent[i] % ids) * size
                    packets: memoryview | bytearray = cycles[i][start : start + k * size]
                    if spec.identities:
                        packets = wire.numbered(packets, size, payload_offset, sent[i])
                    if timing[i] is None and shared.recording.value:
                        timing[i] = (sent[i] + 1, time.monotonic())  # this burst's first
                    socks[i].sendall(packets)
                    sent[i] += k
                    total_sent += k
                    shared.sent[slot] = total_sent
                    hungry.discard(i)
                    room -= k
                    if room <= 0:
                        break
            for key, _ in sel.select(0.002 if sending else 0.05):
                i = key.data
                data = inbox.recv(socks[i])
                if not data:
                    raise ConnectionError("broker closed a publisher connection")
                before = scanners[i].count
                scanners[i].feed(data)
                total_acked += scanners[i].count - before
                if (timed := timing[i]) is not None and scanners[i].count >= timed[0]:
                    _took(shared, slot, time.monotonic() - timed[1])
                    timing[i] = None
                if sent[i] - scanners[i].count <= low_water:
                    hungry.add(i)
            shared.acked[slot] = total_acked
            if not sending and not shared.finished[slot]:
                deadline = deadline or time.monotonic() + DRAIN_TIMEOUT
                if total_acked >= total_sent or time.monotonic() > deadline:
                    shared.finished[slot] = 1
        shared.slow_path[slot] = int(any(s.slow_path for s in scanners))
    finally:
        _close_all(sel)


def _took(shared: Shared, slot: int, seconds: float) -> None:
    """One PUBLISH -> PUBACK time into the slot's ring (a publisher's PUBACKs come in the
    order of its PUBLISHes, so the count says when a given one was acknowledged)."""
    taken = shared.latencies[slot]
    shared.latency[slot * LATENCY_SAMPLES + taken % LATENCY_SAMPLES] = seconds
    shared.latencies[slot] = taken + 1


def _idle(spec: IdleSpec, shared: Shared, slot: int) -> None:
    """Open many connections with a bounded number of handshakes in flight, then hold them."""
    pending = deque(spec.client_ids)
    sel = selectors.DefaultSelector()
    held: list[socket.socket] = []
    in_flight = failed = 0
    try:
        while (pending or in_flight) and shared.phase.value != DONE:
            while pending and in_flight < spec.concurrency:
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", spec.port))
                sel.register(sock, selectors.EVENT_WRITE, [pending.popleft(), b""])
                in_flight += 1
            for key, mask in sel.select(1.0):
                sock, state = key.fileobj, key.data
                assert isinstance(sock, socket.socket)
                if mask & selectors.EVENT_WRITE:
                    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        failed, in_flight = failed + 1, in_flight - 1
                        sel.unregister(sock)
                        sock.close()
                        continue
                    sock.send(wire.connect(state[0]))
                    sel.modify(sock, selectors.EVENT_READ, state)
                    continue
                data = sock.recv(64)
                state[1] += data
                if not data or len(state[1]) >= wire.CONNACK_SIZE:
                    in_flight -= 1
                    sel.unregister(sock)
                    ok = data and getattr(wire.decode_one(state[1]), "reason_code", 1) == 0
                    if ok:
                        held.append(sock)
                    else:
                        failed += 1
                        sock.close()
            shared.connected[slot] = len(held)
        shared.ready[slot] = 1 if not failed else -1
        if failed:
            raise ConnectionError(f"{failed} of {len(spec.client_ids)} connections failed")
        _wait_phase(shared, DONE)
        shared.dropped[slot] = _count_closed(held)
    finally:
        for sock in held:
            sock.close()
        _close_all(sel)


def _count_closed(socks: list[socket.socket]) -> int:
    """How many held connections the broker has closed (readable with EOF)."""
    sel = selectors.DefaultSelector()
    for sock in socks:
        sel.register(sock, selectors.EVENT_READ)
    closed = 0
    for key, _ in sel.select(0):
        with contextlib.suppress(OSError):
            if not key.fileobj.recv(64):  # type: ignore[union-attr]
                closed += 1
    sel.close()
    return closed


def _close_all(sel: selectors.BaseSelector) -> None:
    for key in list(sel.get_map().values()):
        with contextlib.suppress(OSError):
            key.fileobj.close()  # type: ignore[union-attr]
    sel.close()
