"""The load of bench/shared_scale.py: group members and job publishers as raw MQTT 5
clients on asyncio, in a process of their own (`Load`) on the load CPUs, so the broker's
latency seen by the probe is not the generator's."""

import asyncio
import contextlib
import multiprocessing
import os
import resource
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bench import brokers
from bench.brokers import Running
from bench.replication_bench import percentile
from bench.scenarios import PAYLOAD, check_broker
from broker.mqtt import packets as mqtt
from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import PropertyId

V5 = 5
EXPIRY = 3600
JOB_PUBLISHERS = 4
"""Connections publishing the jobs: a publisher's messages live in one storage shard, so a
few of them reach a few shards (and members)."""
TIMEOUT = 30.0
"""Seconds a member's CONNACK or SUBACK may take before it counts as failed."""
RECV = 1 << 16
LATE_JOBS = 5.0
"""Seconds after its window the jobs publisher may still send what the broker held back."""


def own_cpus(cpus: set[int]) -> None:
    """A generator process: on the load CPUs, with every descriptor it may have."""
    os.sched_setaffinity(0, cpus)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def figures(values: list[float], prefix: str) -> dict[str, float]:
    """p50, p99 and max (nearest rank, milliseconds) of `values`, keys `<prefix>_p50_ms`..."""
    if not values:
        return {}
    return {f"{prefix}_{name}_ms": round(percentile(values, q), 2)
            for name, q in (("p50", 50), ("p99", 99), ("max", 100))}


# ---- the probe ---------------------------------------------------------------------------

# ---- members: a raw MQTT 5 client on asyncio ---------------------------------------------

def _connect_packet(client_id: str, durable: bool) -> bytes:
    expiry: dict[int, Any] = {PropertyId.SESSION_EXPIRY_INTERVAL: EXPIRY} if durable else {}
    return encode(mqtt.Connect(client_id, protocol_level=V5, clean_start=not durable,
                               keepalive=0, properties=expiry), V5)


DISCONNECT_V5 = encode(mqtt.Disconnect(), V5)


@dataclass(slots=True)
class Tally:
    """What a window's members and job publishers saw, in the load process."""

    delivered: int = 0  # jobs delivered to members (each acknowledged)
    job_acks: list[float] = field(default_factory=list)  # PUBLISH -> PUBACK, ms
    connacks: list[float] = field(default_factory=list)  # churned members' CONNECT -> CONNACK
    jobs_sent: int = 0  # a publisher waits while the broker's Receive Maximum is used up
    visits: int = 0
    skipped: int = 0  # churn ticks with no offline member left to connect
    failures: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # connections the broker closed


class Link:
    """One MQTT 5 connection: acknowledges every QoS 1 PUBLISH sent to it (a member's
    jobs), hands the reply a `request` waits for to it by its type, and times its own QoS 1
    PUBLISHes (`publish`, at most the broker's Receive Maximum unacknowledged) to their
    PUBACK. A connection the broker closes is noted in the tally, with its DISCONNECT's
    reason code if it sent one."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 tally: Tally) -> None:
        self._reader, self._writer, self.tally = reader, writer, tally
        self._decoder = Decoder(version=V5)
        self._waiting: dict[type, asyncio.Future[mqtt.Packet]] = {}
        self._sent: dict[int, float] = {}
        self._window = 65535
        self._reason: int | None = None  # of a DISCONNECT from the broker
        self._closing = False
        self._pump = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, port: int, client_id: str, durable: bool, tally: Tally) -> "Link":
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), TIMEOUT)
        link = cls(reader, writer, tally)
        try:
            connack = await link.request(_connect_packet(client_id, durable), mqtt.Connack)
            assert isinstance(connack, mqtt.Connack)
            if connack.reason_code:
                raise ConnectionError(f"CONNACK 0x{connack.reason_code:02x}")
            link._window = connack.properties.get(PropertyId.RECEIVE_MAXIMUM, 65535)
        except BaseException:
            link.abort()
            raise
        return link

    async def request(self, data: bytes, reply: type) -> mqtt.Packet:
        future: asyncio.Future[mqtt.Packet] = asyncio.get_running_loop().create_future()
        self._waiting[reply] = future
        self._writer.write(data)
        return await asyncio.wait_for(future, TIMEOUT)

    async def subscribe(self, topic_filter: str) -> None:
        packet = mqtt.Subscribe(1, [mqtt.Subscription(topic_filter, qos=1)])
        suback = await self.request(encode(packet, V5), mqtt.Suback)
        assert isinstance(suback, mqtt.Suback)
        if suback.reason_codes != [1]:
            raise ConnectionError(f"SUBACK {suback.reason_codes} for {topic_filter}")

    async def publish(self, topic: str, payload: bytes, packet_id: int) -> None:
        while len(self._sent) >= self._window and not self._pump.done():
            await asyncio.sleep(0.005)
        self._sent[packet_id] = time.monotonic()
        self._writer.write(encode(mqtt.Publish(topic, payload, 1, packet_id=packet_id), V5))

    async def _read(self) -> None:
        error: Exception = ConnectionError("closed by the broker")
        try:
            while data := await self._reader.read(RECV):
                for packet in self._decoder.feed(data):
                    self._handle(packet)
        except Exception as exc:
            error = exc
        if not self._closing:
            reason = "" if self._reason is None else f" (DISCONNECT 0x{self._reason:02x})"
            self.tally.dropped.append(f"{type(error).__name__}: {error}{reason}")
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)

    def _handle(self, packet: mqtt.Packet) -> None:
        if isinstance(packet, mqtt.Publish):
            self.tally.delivered += 1
            if packet.qos:
                self._writer.write(encode(mqtt.Puback(packet_id=packet.packet_id or 0), V5))
        elif isinstance(packet, mqtt.Puback) and packet.packet_id in self._sent:
            sent = self._sent.pop(packet.packet_id)
            self.tally.job_acks.append((time.monotonic() - sent) * 1000)
        elif isinstance(packet, mqtt.Disconnect):
            self._reason = packet.reason_code
        elif (future := self._waiting.pop(type(packet), None)) and not future.done():
            future.set_result(packet)

    def abort(self) -> None:
        self._closing = True
        self._pump.cancel()
        self._writer.close()

    async def close(self) -> None:
        """DISCONNECT (the session stays, offline), then close."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._writer.write(DISCONNECT_V5)
            await self._writer.drain()
        self.abort()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


class LoadGen:
    """The load process: builds the sessions, holds connected members, churns members and
    publishes jobs, on the orchestrator's commands (a pipe: (command, args) -> a dict)."""

    def __init__(self, port: int, conn: Any) -> None:
        self.port = port
        self.conn = conn
        self.tally = Tally()
        self.held: list[Link] = []
        self.offline: deque[str] = deque()
        self.visiting: set[asyncio.Task[None]] = set()
        self.churning: asyncio.Task[None] | None = None
        self.publishing: asyncio.Task[None] | None = None
        self.publishers: list[Link] = []

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            command, args = await loop.run_in_executor(None, self.conn.recv)
            if command == "exit":
                break
            try:
                reply = await getattr(self, command)(*args)
            except Exception:
                reply = {"error": traceback.format_exc(limit=8)}
            self.conn.send(reply)
        await self.release()

    async def _each(self, ids: list[str], parallel: int,
                    action: Callable[[str], Awaitable[None]]) -> dict[str, Any]:
        """`action` for every client ID, `parallel` at a time: how long, and what failed."""
        gate = asyncio.Semaphore(parallel)
        failures: list[str] = []

        async def one(client_id: str) -> None:
            async with gate:
                try:
                    await action(client_id)
                except Exception as exc:
                    failures.append(f"{client_id}: {type(exc).__name__}: {exc}")

        began = time.monotonic()
        await asyncio.gather(*(one(client_id) for client_id in ids))
        seconds = time.monotonic() - began
        return {"clients": len(ids) - len(failures), "failed": len(failures),
                "seconds": round(seconds, 2), "per_s": round(len(ids) / seconds, 1),
                "first_failure": failures[0] if failures else None}

    async def build(self, subscriptions: dict[str, str | None], parallel: int
                    ) -> dict[str, Any]:
        """Every session made: connect, subscribe, leave."""
        async def make(client_id: str) -> None:
            link = await Link.open(self.port, client_id, True, self.tally)
            try:
                if (topic_filter := subscriptions[client_id]) is not None:
                    await link.subscribe(topic_filter)
            finally:
                await link.close()

        return await self._each(list(subscriptions), parallel, make)

    async def hold(self, ids: list[str], parallel: int) -> dict[str, Any]:
        async def keep(client_id: str) -> None:
            self.held.append(await Link.open(self.port, client_id, True, self.tally))

        return await self._each(ids, parallel, keep)

    async def release(self) -> dict[str, Any]:
        held, self.held = self.held, []
        await asyncio.gather(*(link.close() for link in held))
        return {"released": len(held)}

    async def start(self, churned: list[str], rate: float, hold: float, topics: list[str],
                    jobs: int, seconds: float, label: str) -> dict[str, Any]:
        self.tally = Tally()
        for link in self.held:
            link.tally = self.tally
        self.offline = deque(churned)
        self.publishers = []
        for k in range(JOB_PUBLISHERS):
            self.publishers.append(await Link.open(self.port, f"scale-jobs-{label}-{k}",
                                                   False, self.tally))
        loop = asyncio.get_running_loop()
        self.publishing = loop.create_task(self._jobs(topics, jobs, jobs / seconds))
        if churned and rate:
            self.churning = loop.create_task(self._churn(rate, hold))
        return {}

    async def _churn(self, rate: float, hold: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            if self.offline:
                task = loop.create_task(self._visit(self.offline.popleft(), hold))
                self.visiting.add(task)
                task.add_done_callback(self.visiting.discard)
            else:
                self.tally.skipped += 1
            due += 1 / rate
            await asyncio.sleep(max(0.0, due - loop.time()))

    async def _visit(self, client_id: str, hold: float) -> None:
        began = time.monotonic()
        try:
            link = await Link.open(self.port, client_id, True, self.tally)
            self.tally.connacks.append((time.monotonic() - began) * 1000)
            await asyncio.sleep(hold)
            await link.close()
            self.tally.visits += 1
        except Exception as exc:
            self.tally.failures.append(f"{client_id}: {type(exc).__name__}: {exc}")
        finally:
            self.offline.append(client_id)

    async def _jobs(self, topics: list[str], jobs: int, rate: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        for n in range(jobs):
            link = self.publishers[n % len(self.publishers)]
            await link.publish(topics[n % len(topics)], PAYLOAD, n // len(self.publishers) + 1)
            self.tally.jobs_sent += 1
            due += 1 / rate
            await asyncio.sleep(max(0.0, due - loop.time()))

    async def stop(self) -> dict[str, Any]:
        """Churn stops (the members visiting finish their visit, or are cut short after
        TIMEOUT), the jobs not sent LATE_JOBS s from now are not sent, the PUBACKs of those sent are
        waited for (TIMEOUT at most): what the window's load did."""
        if self.churning is not None:
            self.churning.cancel()
            self.churning = None
        assert self.publishing is not None
        await asyncio.wait({self.publishing}, timeout=LATE_JOBS)
        self.publishing.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self.visiting, self.publishing), TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        while len(self.tally.job_acks) < self.tally.jobs_sent and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.gather(*(link.close() for link in self.publishers))
        t = self.tally
        return {"jobs_sent": t.jobs_sent, "jobs_acked": len(t.job_acks),
                **figures(t.job_acks, "job"),
                "member_deliveries": t.delivered, "churn_visits": t.visits,
                "churn_failures": len(t.failures), "churn_skipped": t.skipped,
                "first_churn_failure": t.failures[0] if t.failures else None,
                "links_dropped": len(t.dropped), "first_drop": t.dropped[0] if t.dropped else None,
                **figures(t.connacks, "churn_connack")}


def _serve(port: int, conn: Any, cpus: set[int]) -> None:
    own_cpus(cpus)
    asyncio.run(LoadGen(port, conn).serve())


class Load:
    """The load process, seen from the orchestrator."""

    def __init__(self, broker: Running) -> None:
        ctx = multiprocessing.get_context("fork")
        self.broker = broker
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(broker.port, child, brokers.load_cpus()),
                                daemon=True)
        self.proc.start()

    def call(self, command: str, *args: Any, limit: float = 3600.0) -> dict[str, Any]:
        self.conn.send((command, args))
        deadline = time.monotonic() + limit
        while not self.conn.poll(0.2):
            check_broker(self.broker)
            if not self.proc.is_alive():
                raise RuntimeError(f"load process died ({self.proc.exitcode}) in {command}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"load process: no answer to {command} in {limit:.0f}s")
        reply: dict[str, Any] = self.conn.recv()
        if "error" in reply:
            raise RuntimeError(f"load process, {command}: {reply['error']}")
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(("exit", ()))
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
