"""Many short MQTT sessions at once: each client connects, gets its CONNACK (and SUBACK, when
it subscribes), says DISCONNECT and leaves, with `concurrency` clients in flight per process.

Why a worker of its own: the durable_bench.py fleet holds every connection open for the
whole run, which 100,000 sessions would turn into a test of the file descriptor limit, and
each of its workers connects one client after the other. Here a process keeps a window of
handshakes in flight on non-blocking sockets (epoll), the way a fleet of devices reconnecting
after an outage hits a broker. Clients leave with a DISCONNECT and wait for the broker to
close first, so the TIME_WAIT of 100,000 closed connections stays on the broker's side
instead of exhausting the client's ephemeral ports; source addresses rotate over
127.0.0.1-127.0.0.SOURCES for the same reason.
"""

import contextlib
import multiprocessing
import os
import resource
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Any

from bench import wire

SOURCES = 16
CONNECT_TIMEOUT = 60.0
_CONNACK = 0x20
_SUBACK = 0x90


@dataclass(frozen=True, slots=True)
class StormSpec:
    port: int
    client_ids: list[str]
    topic: str | None  # "{id}" is replaced by the client ID; None: no SUBSCRIBE
    qos: int = 1
    concurrency: int = 500


@dataclass(slots=True)
class StormResult:
    acknowledged: int = 0  # CONNACK 0 (and the SUBACK granted, when subscribing)
    present: int = 0  # CONNACKs with Session Present 1
    refused: int = 0  # CONNACK != 0, a SUBACK failure, or a connection the broker dropped
    first_s: float = 0.0  # monotonic time of the first CONNACK
    last_s: float = 0.0  # and of the last one
    errors: tuple[str, ...] = ()


class _Client:
    __slots__ = ("client_id", "data", "sock", "state")

    def __init__(self, sock: socket.socket, client_id: str) -> None:
        self.sock = sock
        self.client_id = client_id
        self.data = b""
        self.state = "connecting"  # -> "handshake" -> "leaving"


def _open(port: int, client_id: str, n: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.bind((f"127.0.0.{n % SOURCES + 1}", 0))
    with contextlib.suppress(BlockingIOError):
        sock.connect(("127.0.0.1", port))
    return sock


def _handshake(spec: StormSpec, client: _Client, result: StormResult) -> bool | None:
    """The replies so far: True once acknowledged, False when refused, None: more to read."""
    data = client.data
    if len(data) < 4:
        return None
    if data[0] != _CONNACK or data[3] != 0:
        return False
    now = time.monotonic()
    if not result.first_s:
        result.first_s = now
    result.last_s = now
    if spec.topic is None:
        result.present += data[2] & 1
        return True
    if len(data) < 9:
        return None
    if data[4] != _SUBACK or data[8] != spec.qos:
        return False
    result.present += data[2] & 1
    return True


def run(spec: StormSpec) -> StormResult:
    """Every client of the spec once through; returns what the broker answered."""
    result = StormResult()
    errors: list[str] = []
    sel = selectors.DefaultSelector()
    pending = iter(enumerate(spec.client_ids))
    open_clients = 0
    deadline = time.monotonic() + CONNECT_TIMEOUT + len(spec.client_ids) / 100

    def start_next() -> bool:
        nonlocal open_clients
        item = next(pending, None)
        if item is None:
            return False
        n, client_id = item
        client = _Client(_open(spec.port, client_id, n), client_id)
        sel.register(client.sock, selectors.EVENT_WRITE, client)
        open_clients += 1
        return True

    def finish(client: _Client, refused: str | None) -> None:
        nonlocal open_clients
        sel.unregister(client.sock)
        client.sock.close()
        open_clients -= 1
        if refused is not None:
            result.refused += 1
            if len(errors) < 5:
                errors.append(f"{client.client_id}: {refused}")
        start_next()

    for _ in range(spec.concurrency):
        if not start_next():
            break
    while open_clients:
        if time.monotonic() > deadline:
            raise TimeoutError(f"storm: {open_clients} clients unanswered")
        for key, _ in sel.select(1.0):
            client: _Client = key.data
            sock = client.sock
            if client.state == "connecting":
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    finish(client, f"connect: {os.strerror(error)}")
                    continue
                packet = wire.connect(client.client_id, clean=False)
                if spec.topic is not None:
                    packet += wire.subscribe(spec.topic.replace("{id}", client.client_id),
                                             spec.qos)
                sock.sendall(packet)  # a few dozen bytes: the socket buffer takes them
                client.state = "handshake"
                sel.modify(sock, selectors.EVENT_READ, client)
                continue
            try:
                chunk = sock.recv(4096)
            except ConnectionError as exc:
                chunk = b""
                if client.state == "handshake":
                    finish(client, f"{type(exc).__name__}")
                    continue
            if client.state == "leaving":
                if not chunk:  # the broker closed first: its TIME_WAIT, not ours
                    finish(client, None)
                continue
            if not chunk:
                finish(client, "closed before its CONNACK")
                continue
            client.data += chunk
            done = _handshake(spec, client, result)
            if done is None:
                continue
            if not done:
                finish(client, f"refused: {client.data[:9].hex()}")
                continue
            result.acknowledged += 1
            sock.send(wire.DISCONNECT)
            client.state = "leaving"
    result.errors = tuple(errors)
    return result


def _worker(spec: StormSpec, cpus: set[int], out: Any) -> None:
    os.sched_setaffinity(0, cpus)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        out.put(run(spec))
    except BaseException as exc:  # reported to the parent, which raises it
        out.put(f"{type(exc).__name__}: {exc}")


def storm(specs: list[StormSpec], cpus: set[int]) -> tuple[StormResult, float]:
    """Runs the specs in parallel processes pinned to `cpus`; the results summed, and the
    seconds from the first CONNACK any of them got to the last."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=_worker, args=(spec, cpus, out), daemon=True) for spec in specs]
    for proc in procs:
        proc.start()
    results = [out.get() for _ in procs]
    for proc in procs:
        proc.join(10)
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"storm worker failed: {failed[0]}")
    total = StormResult()
    for r in results:
        total.acknowledged += r.acknowledged
        total.present += r.present
        total.refused += r.refused
        total.errors += r.errors
    firsts = [r.first_s for r in results if r.first_s]
    seconds = max(r.last_s for r in results) - min(firsts) if firsts else 0.0
    return total, seconds
