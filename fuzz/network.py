"""Network fuzzer: broken MQTT conversations against a live broker process.

Many concurrent connections each play one conversation of fuzz/streams.py (valid 3.1,
3.1.1 and 5.0 streams, 70% of them mutated) and read whatever the broker answers; when the
first CONNECT went out intact the answers must decode. Meanwhile two good clients (paho,
3.1.1 and 5.0) publish QoS 1 messages to themselves and must get each one back within the
bound; while one waits over a second, no new conversation starts. After the warm-up and
after each half of the run, once the broker reports only the good clients connected and the
sessions the fuzzing left are ended, the broker's RSS and open descriptors are taken. A finding is:

- the broker process exited;
- a Traceback, or an ERROR or CRITICAL line, in its log. Expected: INFO lines
  "closing <client>: <violation> (<REASON>)" and "no CONNECT in time", one per connection
  the broker ends, which the report counts by reason code. WARNING lines are counted and
  shown, not findings;
- a good client's message back late (latency bound), lost or twice, or a good client
  disconnected;
- RSS growth over the second half of the run above the bound (`Bounds`);
- more open descriptors than after the warm-up, plus the slack, once connections closed;
- answers that do not decode, a connection the broker does not accept, a conversation
  that does not finish in time (the broker stopped reading);
- an exit code other than 0 on SIGTERM at the end.

`python -m fuzz.network --seed S` repeats a run's conversations (their interleaving is up
to the scheduler); `--replay N` sends conversation N alone and prints its packets.
"""

import argparse
import asyncio
import bisect
import contextlib
import itertools
import os
import random
import re
import socket
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bench.procstat import rss_kib
from broker.ds.db import read_db_file, shard_of
from broker.mqtt.codec import Decoder
from broker.mqtt.constants import MQTT_5
from broker.mqtt.constants import PropertyId as P
from broker.mqtt.errors import MQTTError
from broker.mqtt.packets import (
    Disconnect,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)
from fuzz.good import GoodClient, GoodStats
from fuzz.streams import PERSISTENT_IDS, TOPICS, Conversation, conversation
from tests.protocol.rawclient import RawClient
from tests.support.broker_process import BrokerProcess

HOST: Final = "127.0.0.1"
_LOG_LINE: Final = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$")
_CLOSE_REASON: Final = re.compile(r"^closing .*\(([A-Z_]+)\)$")
_MIB: Final = 1024


@dataclass(frozen=True, slots=True)
class Bounds:
    # RSS growth over the second half of the run: a leak grows with every connection or
    # packet, while caches (LevelDB's write buffers and block caches, one each per shard,
    # Python's free lists and arenas) fill in the first half. Python rarely hands freed
    # memory back, so a bound at zero would only measure fragmentation.
    rss_growth_mib: float = 48.0
    fd_slack: int = 16  # Durable Storage may have opened a generation's files meanwhile
    good_latency_s: float = 5.0  # the machine is shared: a loaded core, not a stall
    conversation_s: float = 60.0
    settle_s: float = 60.0
    # New conversations wait while a good client's oldest unanswered message is older than
    # this: the fuzzer is after faults, not the broker's capacity (QoS 1 into topics that
    # durable sessions subscribe to is acknowledged once on disk, and fuzzing clients can
    # fill Durable Storage's write queue faster than it empties). A broker that stops
    # serving stalls the good clients past `good_latency_s` all the same.
    hold_after_s: float = 1.0


@dataclass
class Report:
    seed: int
    bounds: Bounds
    packets: int = 0
    warmup_packets: int = 0
    connections: int = 0
    duration: float = 0.0
    held: float = 0.0  # seconds new conversations waited for the good clients
    findings: list[str] = field(default_factory=list)
    mutations: Counter[str] = field(default_factory=Counter)
    closes: Counter[str] = field(default_factory=Counter)
    warnings: Counter[str] = field(default_factory=Counter)
    rss_kib: dict[str, int] = field(default_factory=dict)
    fds: dict[str, int] = field(default_factory=dict)
    good: list[GoodStats] = field(default_factory=list)
    exit_code: int | None = None

    def render(self) -> str:
        rate = self.packets / self.duration if self.duration else 0.0
        rss = {k: v / _MIB for k, v in self.rss_kib.items()}
        lines = [
            f"network fuzz, seed {self.seed} (again: make fuzz SEED={self.seed})",
            f"  packets       {self.packets:,} (+{self.warmup_packets:,} warm-up) in "
            f"{self.connections:,} connections, {self.duration:.1f} s ({rate:,.0f} packets/s; "
            f"{self.held:.1f} s held for the good clients)",
            f"  broker closed {_counts(self.closes)}",
            f"  mutations     {_counts(self.mutations)}",
            *(f"  good client   {stats.render()}" for stats in self.good),
        ]
        if "end" in rss:
            lines.append(
                f"  broker RSS    start {rss['start']:.1f} MiB, after warm-up {rss['warm']:.1f}, "
                f"half-way {rss['mid']:.1f}, end {rss['end']:.1f}, peak {rss['peak']:.1f}; "
                f"second half {rss['end'] - rss['mid']:+.1f} MiB "
                f"(bound +{self.bounds.rss_growth_mib:.0f})")
            lines.append(
                f"  broker fds    start {self.fds['start']}, after warm-up {self.fds['warm']}, "
                f"end {self.fds['end']} (bound +{self.bounds.fd_slack})")
        lines += [
            f"  log warnings  {_counts(self.warnings) or 'none'}",
            f"  SIGTERM exit  {self.exit_code}",
            f"  findings      {len(self.findings)}",
            *(f"    - {finding}" for finding in self.findings),
        ]
        return "\n".join(lines)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{name} {count:,}" for name, count in counter.most_common())


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class _Traffic:
    """The fuzzing connections: `connections` at a time until `packets` were written."""

    def __init__(self, broker: BrokerProcess, seed: int, first: int, packets: int,
                 connections: int, bounds: Bounds, good: list[GoodClient],
                 progress: Callable[[int], None] | None = None) -> None:
        self.broker = broker
        self.good = good
        self.seed = seed
        self.next_index = first
        self.target = packets
        self.width = connections
        self.bounds = bounds
        self.progress = progress
        self.packets = 0
        self.connections = 0
        self.held = 0.0
        self.dead = False
        self.findings: list[str] = []
        self.mutations: Counter[str] = Counter()
        self._flowing = asyncio.Event()

    def alive(self) -> bool:
        return self.broker.proc is not None and self.broker.proc.poll() is None

    async def run(self) -> None:
        self._flowing.set()
        watcher = asyncio.create_task(self._watch_good())
        try:
            await asyncio.gather(*(self._worker() for _ in range(self.width)))
        finally:
            watcher.cancel()

    async def _watch_good(self) -> None:
        """Holds new conversations while a good client waits longer than `hold_after_s`.
        How long its oldest message has been out grows with the clock, not with an event:
        it is polled."""
        held_since = 0.0
        try:
            while True:
                lag = max((client.lag() for client in self.good), default=0.0)
                if lag > self.bounds.hold_after_s and not held_since:
                    held_since = time.monotonic()
                    self._flowing.clear()
                elif lag <= self.bounds.hold_after_s and held_since:
                    self.held += time.monotonic() - held_since
                    held_since = 0.0
                    self._flowing.set()
                await asyncio.sleep(0.1)  # a polling period, not a wait for something
        finally:
            if held_since:
                self.held += time.monotonic() - held_since

    async def _worker(self) -> None:
        while self.packets < self.target and not self.dead:
            await self._flowing.wait()
            conv = conversation(self.seed, self.next_index)
            self.next_index += 1
            try:
                await asyncio.wait_for(self.play(conv), self.bounds.conversation_s)
            except TimeoutError:
                self.findings.append(f"conversation {conv.index} not finished within "
                                     f"{self.bounds.conversation_s:.0f} s")
            if self.progress is not None:
                self.progress(self.packets)

    async def play(self, conv: Conversation) -> None:
        rng = random.Random(f"{self.seed}/{conv.index}")  # how this conversation ends
        try:
            reader, writer = await asyncio.open_connection(HOST, self.broker.tcp)
        except OSError as error:
            if self.alive():
                self.findings.append(f"conversation {conv.index}: connect failed: {error!r}")
            self.dead = True
            return
        self.connections += 1
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reading = asyncio.create_task(self._read(reader, conv))
        written = 0
        with contextlib.suppress(OSError):  # ENOTCONN, ECONNRESET, EPIPE: the broker closed
            for chunk in conv.writes:
                if reading.done():  # the broker closed the connection
                    break
                writer.write(chunk)
                await writer.drain()
                written += len(chunk)
            if not reading.done() and rng.random() < 0.5:
                writer.write_eof()  # and read what the broker answers until it closes
                await reading
        if rng.random() < 0.2:
            writer.transport.abort()  # RST instead of FIN
        else:
            writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        self.packets += bisect.bisect_right(conv.ends, written)
        self.mutations.update(m.split("@")[0] for m in conv.mutations)

    async def _read(self, reader: asyncio.StreamReader, conv: Conversation) -> None:
        """Reads until the broker closes; the answers must decode if the CONNECT was sent
        as made (otherwise the broker may rightly answer in another version, or not)."""
        decoder = Decoder(version=conv.version) if conv.intact_connect else None
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if decoder is None:
                    continue
                try:
                    decoder.feed(data)
                except MQTTError as error:
                    self.findings.append(f"conversation {conv.index}: broker's answer does "
                                         f"not decode: {error}")
                    decoder = None


async def _play(traffic: _Traffic, pid: int, peak: list[int]) -> None:
    """Runs the traffic and samples the broker's RSS meanwhile, for the peak."""
    async def sample() -> None:
        while True:
            with contextlib.suppress(OSError, RuntimeError):
                peak[0] = max(peak[0], rss_kib(pid))
            await asyncio.sleep(0.5)  # a sampling period, not a wait for something

    sampler = asyncio.create_task(sample())
    try:
        await traffic.run()
    finally:
        sampler.cancel()


def _connections(broker: BrokerProcess) -> int:
    """Connections the broker holds (its `mqtt_connections` gauge)."""
    with urllib.request.urlopen(f"http://{HOST}:{broker.ports['http']}/metrics",
                                timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("mqtt_connections "):
                return int(float(line.split()[1]))
    raise RuntimeError("no mqtt_connections in /metrics")


def _settle(broker: BrokerProcess, expected: int, timeout: float) -> bool:
    """Waits until the broker has let go of every fuzzing connection. The broker has no
    event to wait on from outside: its connection gauge is polled."""
    deadline = time.monotonic() + timeout
    while broker.proc is not None and broker.proc.poll() is None:
        if _connections(broker) == expected:
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return False


def _end_sessions(broker: BrokerProcess, timeout: float) -> None:
    """Ends the sessions the fuzzing left behind (the persistent client IDs, with clean
    start) and clears the retained messages of its topics, so that what the broker holds
    afterwards is only what it should not: their queues and stored messages are state the
    clients asked for, not a leak."""
    for number in range(PERSISTENT_IDS):
        _end_session(broker, f"fzp{number}", timeout)
    raw = RawClient(broker.tcp, MQTT_5, timeout)
    raw.connect("fz-cleanup")
    for packet_id, topic in enumerate(TOPICS, 1):
        raw.send(Publish(topic, b"", 1, True, False, packet_id))
        assert isinstance(raw.recv(), Puback)
    _disconnect(raw)


def _create_every_shard(broker: BrokerProcess, timeout: float) -> None:
    """One stored message in each shard of the messages database, so that the descriptors
    taken after the warm-up hold every shard's files: a shard is created on its first
    write, and the run's shards opened later are storage the clients asked for, not a leak.
    A durable session subscribes, a publisher per shard (a client ID hashed to it) sends it
    a QoS 1 message, and the session is ended."""
    found = read_db_file(broker.data_dir / "ds" / "messages")
    if found is None:  # durable sessions off: no shards
        return
    n_shards: int = found["n_shards"]
    raw = RawClient(broker.tcp, MQTT_5, timeout)
    raw.connect("fz-shards", clean_start=True, properties={P.SESSION_EXPIRY_INTERVAL: 60})
    raw.send(Subscribe(1, [Subscription("fz/shards/#", 1)]))
    assert isinstance(raw.recv(), Suback)
    ids = (f"fz-shard-{n}" for n in itertools.count())
    for shard in range(n_shards):
        client_id = next(c for c in ids if shard_of(c, n_shards) == shard)
        publisher = RawClient(broker.tcp, MQTT_5, timeout)
        publisher.connect(client_id)
        publisher.send(Publish(f"fz/shards/{shard}", b"", 1, False, False, 1))
        assert isinstance(publisher.recv(), Puback)
        _disconnect(publisher)
    raw.close()
    _end_session(broker, "fz-shards", timeout)


def _end_session(broker: BrokerProcess, client_id: str, timeout: float) -> None:
    """`client_id`'s session ended: a clean start, then a DISCONNECT (expiry 0)."""
    raw = RawClient(broker.tcp, MQTT_5, timeout)
    raw.connect(client_id, clean_start=True)
    _disconnect(raw)


def _disconnect(raw: RawClient) -> None:
    """A normal DISCONNECT, and the broker's close of the connection awaited."""
    raw.send(Disconnect())
    raw.closed_by_broker()
    raw.close()


def _log_barrier(broker: BrokerProcess, timeout: float) -> None:
    """Returns once every line the broker logged before now has been read from its pipe:
    a connection it must log ("no CONNECT": a PUBLISH first) is made, and its line awaited."""
    with socket.create_connection((HOST, broker.tcp), timeout=timeout) as sock:
        peer = "{}:{}".format(*sock.getsockname())
        sock.sendall(b"\x30\x03\x00\x01x")
        sock.recv(16)  # until the broker closes it
    deadline = time.monotonic() + timeout
    while not any(peer in line for line in broker.log_lines[-50:]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the broker did not log closing {peer} within {timeout} s")
        time.sleep(0.01)


def _scan_log(lines: list[str], report: Report) -> None:
    for number, line in enumerate(lines):
        if "Traceback" in line:
            context = " | ".join(lines[max(0, number - 1) : number + 12])
            report.findings.append(f"Traceback in the broker log: {context}")
        match = _LOG_LINE.match(line)
        if match is None:
            continue
        level, logger, message = match.groups()
        if level in ("ERROR", "CRITICAL"):
            report.findings.append(f"{level} in the broker log: {logger}: {message}")
        elif level == "WARNING":
            report.warnings[f"{logger}: {message[:60]}"] += 1
        elif logger == "broker.server.connection" and message.startswith("closing "):
            reason = _CLOSE_REASON.match(message)
            report.closes[reason.group(1) if reason else "NO_CONNECT_IN_TIME"] += 1


def run(broker: BrokerProcess, seed: int, packets: int, *, connections: int = 32,
        warmup: int | None = None, bounds: Bounds = Bounds(),
        progress: Callable[[int], None] | None = None) -> Report:
    """Fuzzes the started `broker` with `packets` packets after `warmup` more, checks it,
    stops it (SIGTERM) and returns the report; `progress` gets the packet count as it goes.

    Three phases: the warm-up, then the two halves of the run. After each, the broker must
    let go of every fuzzing connection, the sessions the fuzzing left are ended, and RSS
    and descriptors are taken."""
    assert broker.proc is not None
    pid = broker.proc.pid
    report = Report(seed, bounds)
    report.rss_kib["start"], report.fds["start"] = rss_kib(pid), open_fds(pid)
    good = [GoodClient(broker.tcp, 5, f"good-v5-{seed}"),
            GoodClient(broker.tcp, 4, f"good-v311-{seed}")]
    for client in good:
        client.start()
    if warmup is None:
        warmup = max(2_000, packets // 50)
    phases = (("warm", warmup), ("mid", packets // 2), ("end", packets - packets // 2))
    peak, index, sent = [0], 0, 0
    for phase, count in phases:
        def counted(now: int, before: int = sent) -> None:
            if progress is not None:
                progress(before + now)

        traffic = _Traffic(broker, seed, index, count, connections, bounds, good,
                           None if phase == "warm" else counted)
        started = time.monotonic()
        asyncio.run(_play(traffic, pid, peak))
        index = traffic.next_index
        report.connections += traffic.connections
        report.mutations += traffic.mutations
        report.findings += traffic.findings
        if phase == "warm":
            report.warmup_packets = traffic.packets
        else:
            report.duration += time.monotonic() - started
            report.held += traffic.held
            report.packets += traffic.packets
            sent += traffic.packets
        if phase == "warm":
            _create_every_shard(broker, bounds.settle_s)
        if not _settle(broker, len(good), bounds.settle_s):
            break
        _end_sessions(broker, bounds.settle_s)
        if not _settle(broker, len(good), bounds.settle_s):
            break
        report.rss_kib[phase], report.fds[phase] = rss_kib(pid), open_fds(pid)
    report.rss_kib["peak"] = max(peak[0], *report.rss_kib.values())
    report.good = [client.stop(bounds.good_latency_s) for client in good]
    if broker.proc.poll() is not None:
        report.findings.insert(0, f"broker process exited (code {broker.proc.poll()})")
        _scan_log(broker.log_lines, report)
        return report
    _check(report, broker)
    _log_barrier(broker, bounds.settle_s)
    _scan_log(broker.log_lines, report)
    report.exit_code = broker.stop()
    if report.exit_code != 0:
        report.findings.append(f"broker exited with {report.exit_code} on SIGTERM")
    return report


def _check(report: Report, broker: BrokerProcess) -> None:
    """The findings in the figures: memory, descriptors, the good clients."""
    bounds = report.bounds
    if "end" not in report.rss_kib:
        report.findings.append(f"{_connections(broker)} connections still open "
                               f"{bounds.settle_s:.0f} s after the fuzzing ones closed "
                               f"(2 good clients)")
    else:
        growth = (report.rss_kib["end"] - report.rss_kib["mid"]) / _MIB
        if growth > bounds.rss_growth_mib:
            report.findings.append(f"broker RSS grew by {growth:.1f} MiB over the second "
                                   f"half (bound {bounds.rss_growth_mib:.0f})")
        if report.fds["end"] > report.fds["warm"] + bounds.fd_slack:
            report.findings.append(f"broker holds {report.fds['end']} descriptors, "
                                   f"{report.fds['warm']} after the warm-up")
    for stats in report.good:
        if stats.missing or stats.duplicates or stats.disconnects:
            report.findings.append(f"good client not served: {stats.render()}")
        elif stats.max_latency > bounds.good_latency_s:
            report.findings.append(f"good client waited {stats.max_latency:.1f} s (bound "
                                   f"{bounds.good_latency_s:.0f} s)")


def replay(broker: BrokerProcess, seed: int, index: int) -> list[str]:
    """Sends conversation `index` of `seed` alone; returns the findings (broker log)."""
    conv = conversation(seed, index)
    print(f"conversation {index} of seed {seed}: v{conv.version}, client {conv.client_id!r}, "
          f"mutations {conv.mutations or 'none'}")
    for number, packet in enumerate(conv.packets):
        print(f"  {number:3d} {packet[:64].hex(' ')}{' ...' if len(packet) > 64 else ''}")
    traffic = _Traffic(broker, seed, index, 0, 1, Bounds(), [])
    asyncio.run(traffic.play(conv))
    report = Report(seed, Bounds(), findings=traffic.findings)
    _log_barrier(broker, 10)
    _scan_log(broker.log_lines, report)
    print("\n".join(line for line in broker.log_lines if "broker.server" in line)[-4000:])
    return report.findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.network", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="0: a random one (printed)")
    parser.add_argument("--packets", type=int, default=1_000_000)
    parser.add_argument("--connections", type=int, default=32, help="at a time")
    parser.add_argument("--replay", type=int, metavar="N", help="send conversation N alone")
    parser.add_argument("--hold-after", type=float, default=Bounds().hold_after_s,
                        help="a good client's wait (s) that holds new conversations")
    args = parser.parse_args(argv)
    seed = args.seed or random.randrange(1, 2**31)
    with tempfile.TemporaryDirectory(prefix="mqtt-fuzz-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            if args.replay is not None:
                findings = replay(broker, seed, args.replay)
                print("\n".join(findings) or "no finding")
                return 1 if findings else 0
            step = max(1, args.packets // 10)
            marks = iter(range(step, args.packets + step, step))
            mark = next(marks)
            started = time.monotonic()

            def progress(sent: int) -> None:
                nonlocal mark
                if sent >= mark:
                    print(f"  {sent:,} packets, {time.monotonic() - started:.0f} s", flush=True)
                    mark = next(marks, sys.maxsize)

            print(f"network fuzz: seed {seed}, {args.packets:,} packets, "
                  f"{args.connections} connections at a time", flush=True)
            report = run(broker, seed, args.packets, connections=args.connections,
                         bounds=Bounds(hold_after_s=args.hold_after), progress=progress)
        finally:
            broker.kill()
    print(report.render())
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
