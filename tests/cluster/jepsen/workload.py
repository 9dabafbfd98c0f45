"""Real MQTT clients (paho, one thread each) that drive a cluster and record what they see.

- Publishers send numbered QoS 1 / QoS 2 messages (`p2:17` on `jepsen/<run>/p2`), at most
  `window` unacknowledged at a time, each connection a new session (Clean Start 1, Session
  Expiry 0). Every PUBLISH is recorded as an Attempt before it is sent, its PUBACK /
  PUBCOMP as an Ack (from paho's on_publish); when the connection ends first, as a Fail, and
  with `resend` the message is sent again (same seq) on the next connection. A new paho
  object per connection: paho would otherwise resend its in-flight QoS 2 messages with DUP
  on a session the broker never saw, which no checker could tell from a broker duplicate.
- Durable subscribers (Clean Start 0, a long Session Expiry) subscribe once with QoS 2 to
  `jepsen/<run>/#`, then disconnect (DISCONNECT, or a reset without one) and reconnect to a
  random node every few seconds, following a CONNACK 0x9C's Server Reference to the node
  that holds their session. One paho object each for the whole run, so its QoS 2 state
  (PUBRECs sent, PUBRELs awaited) survives reconnections as MQTT requires.
- A `Directory` says which nodes clients may reach and on which port: what a load balancer
  over Ready nodes would offer. The nemesis (faults.py) takes a killed node out and puts it
  back once it is linked to the others again.

Before publishing starts, a probe is published on every node until every subscriber has
received it: from then on every node routes the workload's topics to the subscribers'
nodes, so a message not delivered is the broker's doing, not route propagation.

    recorder = Recorder()
    with Workload(directory, recorder, WorkloadConfig(seed=7)) as workload:
        workload.start()
        workload.run_for(3)
        ...  # faults
        report = workload.finish()
    assert report.ok, report.summary()
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho_mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.cluster.jepsen.history import (
    Ack,
    Attempt,
    Connected,
    Delivered,
    Ended,
    Event,
    Fail,
    Key,
    Report,
    Subscribed,
    check,
    parse_payload,
    payload,
)

HOST = "127.0.0.1"
USE_ANOTHER_SERVER = 0x9C


# ---- where clients may connect ----------------------------------------------------------------
class Directory:
    """Node name -> MQTT port of the nodes clients may reach now (thread-safe)."""

    def __init__(self, ports: dict[str, int] | None = None) -> None:
        self._lock = threading.Lock()
        self._ports: dict[str, int] = dict(ports or {})
        self._names: dict[int, str] = {port: name for name, port in self._ports.items()}

    def set(self, name: str, port: int) -> None:
        with self._lock:
            self._ports[name] = port
            self._names[port] = name

    def remove(self, name: str) -> None:
        with self._lock:
            self._ports.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._ports)

    def port(self, name: str) -> int | None:
        with self._lock:
            return self._ports.get(name)

    def name_at(self, port: int) -> str:
        """The node that listens (or listened last) on `port`, for a Server Reference."""
        with self._lock:
            return self._names.get(port, f"?{port}")

    def pick(self, rng: random.Random, among: Iterable[str] | None = None
             ) -> tuple[str, int] | None:
        with self._lock:
            names = sorted(self._ports if among is None else
                           [name for name in among if name in self._ports])
            if not names:
                return None
            name = rng.choice(names)
            return name, self._ports[name]


# ---- the recorder -----------------------------------------------------------------------------
class Recorder:
    """The history: events appended under one lock, in the order they happened. Keeps what
    `complete()` needs to tell, cheaply, whether every subscriber has what it should."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.events: list[Event] = []
        self.times: list[float] = []  # wall clock of each event, to read next to node logs
        self._first_attempt: dict[Key, int] = {}
        self._acked: dict[Key, int] = {}  # acknowledged -> index of its first Attempt
        self._subscribed: dict[str, int] = {}
        self._received: dict[str, set[Key]] = {}
        self._received_by_anyone: set[Key] = set()
        self._dropped: set[Key] = set()  # QoS 2 messages dropped with an ended session

    def record(self, event: Event) -> None:
        with self._cond:
            index = len(self.events)
            self.events.append(event)
            self.times.append(time.time())
            if isinstance(event, Attempt):
                self._first_attempt.setdefault((event.publisher, event.seq), index)
            elif isinstance(event, Ack):
                key = (event.publisher, event.seq)
                self._acked.setdefault(key, self._first_attempt[key])
            elif isinstance(event, Subscribed):
                self._subscribed.setdefault(event.subscriber, index)
                self._received.setdefault(event.subscriber, set())
            elif isinstance(event, Delivered):
                key = (event.publisher, event.seq)
                self._received.setdefault(event.subscriber, set()).add(key)
                self._received_by_anyone.add(key)
            elif isinstance(event, Ended):
                self._dropped.update(event.dropped)
            self._cond.notify_all()

    def missing(self) -> dict[str, int]:
        """Subscriber -> acknowledged messages it should have and has not received yet."""
        with self._cond:
            return {subscriber: sum(1 for key, first in self._acked.items()
                                    if first > joined and key not in self._received[subscriber])
                    for subscriber, joined in self._subscribed.items()}

    def missing_from_group(self) -> int:
        """Acknowledged messages no subscriber has received yet, of those first sent after
        the first SUBACK (the members of one shared subscription), but those dropped with
        an ended session."""
        with self._cond:
            joined = min(self._subscribed.values(), default=len(self.events))
            return sum(1 for key, first in self._acked.items()
                       if first > joined and key not in self._received_by_anyone and
                       key not in self._dropped)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.2))
            return True

    def subscribed(self) -> dict[str, int]:
        with self._cond:
            return dict(self._subscribed)

    def snapshot(self) -> list[Event]:
        with self._cond:
            return list(self.events)

    def dump(self, path: Path) -> None:
        """The history as JSON lines: index, wall-clock time, event type and fields."""
        with self._cond:
            rows = list(zip(self.times, self.events, strict=True))
        with path.open("w") as out:
            for index, (at, event) in enumerate(rows):
                out.write(json.dumps({"i": index, "t": round(at, 6),
                                      "type": type(event).__name__, **asdict(event)}) + "\n")


# ---- one paho client ----------------------------------------------------------------------------
@dataclass
class Connack:
    reason_code: int
    session_present: bool
    reference: str = ""  # Server Reference (MQTT 5), with 0x9C


class Client:
    """A paho client object, connected to one node at a time, with blocking steps that time
    out. Automatic reconnection is off: the workload decides where to go next."""

    def __init__(self, client_id: str, version: int = 5, *, durable: bool = False,
                 manual_ack: bool = False, receive_maximum: int | None = None,
                 on_connect: Callable[[Connack], None] | None = None,
                 on_message: Callable[[Any], None] | None = None,
                 on_publish: Callable[[int, int], None] | None = None,
                 on_disconnect: Callable[[], None] | None = None) -> None:
        self.version = version
        self.durable = durable
        protocol = paho_mqtt.MQTTv5 if version == 5 else paho_mqtt.MQTTv311
        self.paho = paho_mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
            clean_session=None if version == 5 else not durable,
            reconnect_on_failure=False, manual_ack=manual_ack)
        self.receive_maximum = receive_maximum
        self.paho.connect_timeout = 3.0
        self.paho.max_inflight_messages_set(100)
        self.paho.max_queued_messages_set(0)
        self._cond = threading.Condition()
        self._connack: Connack | None = None
        self._subacks: dict[int, list[int]] = {}
        self.connected = False
        self._ended = False
        self._hooks = (on_connect, on_message, on_publish, on_disconnect)
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = self._on_disconnect
        self.paho.on_subscribe = self._on_subscribe
        if on_message is not None:
            self.paho.on_message = lambda _c, _u, message: on_message(message)
        if on_publish is not None:
            self.paho.on_publish = (lambda _c, _u, mid, reason, _p:
                                    on_publish(mid, _code(reason)))

    def _on_connect(self, _client: Any, _userdata: Any, flags: Any, reason: Any,
                    properties: Any) -> None:
        connack = Connack(_code(reason), bool(flags.session_present),
                          str(getattr(properties, "ServerReference", "") or ""))
        if self._hooks[0] is not None and connack.reason_code == 0:
            self._hooks[0](connack)  # before any PUBLISH of the session is handed over
        with self._cond:
            self._connack = connack
            self.connected = connack.reason_code == 0
            self._cond.notify_all()

    def _on_disconnect(self, *_args: Any) -> None:
        with self._cond:
            self.connected = False
            self._ended = True
            self._cond.notify_all()
        if self._hooks[3] is not None:
            self._hooks[3]()

    def _on_subscribe(self, _client: Any, _userdata: Any, mid: int, reasons: Any,
                      _properties: Any) -> None:
        with self._cond:
            self._subacks[mid] = [_code(reason) for reason in reasons]
            self._cond.notify_all()

    def connect(self, port: int, *, clean_start: bool, expiry: int, keepalive: int,
                timeout: float, host: str = HOST) -> Connack | None:
        """CONNECT and wait for the CONNACK; None if there was none in time (the attempt
        is abandoned and its socket reset)."""
        self.finish()
        with self._cond:
            self._connack, self._ended, self.connected = None, False, False
        kwargs: dict[str, Any] = {"keepalive": keepalive}
        if self.version == 5:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = expiry
            if self.receive_maximum is not None:
                properties.ReceiveMaximum = self.receive_maximum
            kwargs.update(clean_start=clean_start, properties=properties)
        try:
            self.paho.connect(host, port, **kwargs)
        except (OSError, ValueError):
            return None
        self.paho.loop_start()
        with self._cond:
            self._cond.wait_for(lambda: self._connack is not None or self._ended, timeout)
            connack = self._connack
        if connack is None:
            self.abort()
            return None
        if connack.reason_code != 0:
            self.finish()
        return connack

    def subscribe(self, topic_filter: str, qos: int, timeout: float) -> list[int] | None:
        result, mid = self.paho.subscribe(topic_filter, qos)
        if result != paho_mqtt.MQTT_ERR_SUCCESS:
            return None
        with self._cond:
            self._cond.wait_for(lambda: mid in self._subacks or self._ended, timeout)
            return self._subacks.pop(mid, None)

    def wait_ended(self, timeout: float, stop: threading.Event) -> bool:
        """Waits until the connection ends, `stop` is set or `timeout` passes; True if the
        connection ended."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._ended and not stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.1))
            return self._ended

    def disconnect(self) -> None:
        """A DISCONNECT (the session stays, by its expiry), then the network thread ends."""
        if self.connected:
            self.paho.disconnect()
            with self._cond:
                self._cond.wait_for(lambda: self._ended, 3.0)
        self.abort()

    def abort(self) -> None:
        """The connection dies without DISCONNECT: a reset (SO_LINGER 0), as a client whose
        network went away."""
        sock = self.paho.socket()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RDWR)
        self.finish()

    def finish(self) -> None:
        """Ends the network thread (the connection is gone or going): no callback after."""
        self.paho.loop_stop()
        with self._cond:
            self.connected = False


def _code(reason: Any) -> int:
    return int(getattr(reason, "value", reason))


# ---- the workload -----------------------------------------------------------------------------
@dataclass
class WorkloadConfig:
    publishers: int = 3
    subscribers: int = 3
    seed: int = 0
    rate: float = 30.0  # messages per second and publisher
    window: int = 8  # unacknowledged messages per publisher
    qos2_share: float = 0.5
    stay: tuple[float, float] = (1.0, 4.0)  # seconds a subscriber stays connected
    abrupt: float = 0.3  # share of subscriber disconnections without DISCONNECT
    keepalive: int = 2  # a frozen node is left after ~2 keepalives
    connect_timeout: float = 6.0  # a claim round waits up to min(5 s, ticktime) per peer
    session_expiry: int = 3600
    version: int = 5  # 3.1.1 (4) clients get no Server Reference, only return code 3
    resend: bool = True  # send unacknowledged messages again on the next connection
    homes: list[str] | None = None  # nodes of the subscribers' first connection (in turn)
    # and of a subscription made again after its session ended; when down, any node
    publisher_nodes: list[str] | None = None  # nodes publishers may use (default: all)
    host: str = HOST  # where the directory's ports listen (a Kubernetes Service's IP)


@dataclass
class Stats:
    redirects: int = 0
    refused: int = 0  # CONNACKs with an error other than a redirect, or none in time
    subscriber_connections: int = 0
    publisher_connections: int = 0


@dataclass
class _Inflight:
    """One publisher connection's unacknowledged messages."""

    conn: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    open: dict[int, int] = field(default_factory=dict)  # seq -> qos
    by_mid: dict[int, int] = field(default_factory=dict)  # mid -> seq
    early: dict[int, int] = field(default_factory=dict)  # mid -> reason, ack before mapped


class Workload:
    label = "plain"  # names its history file and its figures

    def __init__(self, directory: Directory, recorder: Recorder,
                 config: WorkloadConfig | None = None, run: str | None = None) -> None:
        self.directory = directory
        self.recorder = recorder
        self.config = config or WorkloadConfig()
        self.run = run or uuid.uuid4().hex[:8]
        self.prefix = f"jepsen/{self.run}"
        self.topic_filter = f"{self.prefix}/#"  # what the subscribers subscribe to
        self.stats = Stats()
        self.errors: list[BaseException] = []
        self._stop_publishers = threading.Event()
        self._stop_subscribers = threading.Event()
        self._publishers: list[threading.Thread] = []
        self._subscribers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._homes: dict[str, str] = {}
        self._probes: dict[str, set[bytes]] = {}
        self._clients: list[Client] = []

    # ---- life cycle ---------------------------------------------------------------------------
    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> None:
        """Subscribers connected and subscribed, every node routing to them, publishers on."""
        config = self.config
        for index in range(config.subscribers):
            name = f"s{index + 1}"
            home = config.homes[index % len(config.homes)] if config.homes else None
            self._spawn(self._subscribers, self._subscriber, name, home)
        if not self.recorder.wait_for(
                lambda: len(self.recorder.subscribed()) == config.subscribers or
                bool(self.errors), timeout):
            raise AssertionError(f"subscribers not subscribed in {timeout}s:"
                                 f" {self.recorder.subscribed()}")
        self._raise_errors()
        self._probe(timeout)
        for index in range(config.publishers):
            self._spawn(self._publishers, self._publisher, f"p{index + 1}")

    def run_for(self, seconds: float) -> None:
        """Lets the workload run (the clients' threads do the work); fails early if one of
        them failed."""
        run_together([self], seconds)

    def stop_publishers(self, timeout: float = 20.0) -> None:
        self._stop_publishers.set()
        for thread in self._publishers:
            thread.join(timeout)

    def pending(self) -> int:
        """Deliveries still due: acknowledged messages a subscriber should have and has not
        received yet."""
        return sum(self.recorder.missing().values())

    def drain(self, timeout: float = 30.0) -> bool:
        """Waits until every subscriber has every acknowledged message it should have."""
        return self.recorder.wait_for(lambda: not self.pending(), timeout)

    def check(self) -> Report:
        return check(self.recorder.snapshot())

    def stop(self) -> None:
        self._stop_publishers.set()
        self._stop_subscribers.set()
        for thread in [*self._publishers, *self._subscribers]:
            thread.join(20)
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:  # those whose thread did not finish (cannot happen normally)
            client.abort()

    def finish(self, drain_timeout: float = 30.0) -> Report:
        """Stop publishing, wait for the subscribers to catch up (or the timeout), check."""
        self.stop_publishers()
        self.drain(drain_timeout)
        self.stop()
        self._raise_errors()
        return self.check()

    def homes(self) -> dict[str, str]:
        """Subscriber -> node where it subscribed: where its durable session lives."""
        with self._lock:
            return dict(self._homes)

    def durable_filters(self) -> int:
        """Entries the subscribers' sessions make in a node's durable filters."""
        return len(self.homes())

    def _spawn(self, threads: list[threading.Thread], target: Callable[..., None],
               *args: Any) -> None:
        def run() -> None:
            try:
                target(*args)
            except BaseException as error:  # reported by run_for / finish
                self.errors.append(error)

        thread = threading.Thread(target=run, name=f"jepsen-{args[0]}", daemon=True)
        threads.append(thread)
        thread.start()

    def _raise_errors(self) -> None:
        if self.errors:
            raise AssertionError(f"a workload client failed: {self.errors[0]!r}") \
                from self.errors[0]

    def _track(self, client: Client, add: bool) -> None:
        with self._lock:
            if add:
                self._clients.append(client)
            elif client in self._clients:
                self._clients.remove(client)

    # ---- connecting ---------------------------------------------------------------------------
    def _connect(self, client: Client, target: tuple[str, int], clean_start: bool,
                 here: dict[str, str] | None = None) -> tuple[str, Connack] | None:
        """Connects, following up to 3 redirects (0x9C + Server Reference); the node
        reached and its CONNACK, or None. `here` (read by the client's callbacks) names
        the node being dialled, redirect after redirect."""
        config = self.config
        name, port = target
        expiry = config.session_expiry if client.durable else 0
        for _hop in range(4):
            if here is not None:
                here["node"] = name
            connack = client.connect(port, clean_start=clean_start, expiry=expiry,
                                     keepalive=config.keepalive, timeout=config.connect_timeout,
                                     host=config.host)
            if connack is None:
                break
            if connack.reason_code == 0:
                return name, connack
            if connack.reason_code == USE_ANOTHER_SERVER and connack.reference:
                with self._lock:
                    self.stats.redirects += 1
                port = int(connack.reference.rpartition(":")[2])
                name = self.directory.name_at(port)
                continue
            break
        with self._lock:
            self.stats.refused += 1
        return None

    # ---- subscribers --------------------------------------------------------------------------
    def _subscriber_client(self, name: str, here: dict[str, str], **options: Any) -> Client:
        """The subscriber's paho client, for the whole run: its callbacks record a CONNACK
        (`here` names the node) and each PUBLISH handed over."""
        probe_topic = f"{self.prefix}/probe"

        def connected(connack: Connack) -> None:
            self.recorder.record(Connected(name, here["node"], connack.session_present))

        def message(received: Any) -> None:
            if received.topic == probe_topic:
                with self._lock:
                    self._probes.setdefault(name, set()).add(bytes(received.payload))
            else:
                key = parse_payload(bytes(received.payload)) or ("", -1)
                self.recorder.record(Delivered(name, key[0], key[1], received.qos,
                                               bool(received.dup), here["node"]))
            self._handed_over(name, received)

        return Client(f"{self.run}-{name}", self.config.version, durable=True,
                      on_connect=connected, on_message=message, **options)

    def _handed_over(self, name: str, received: Any) -> None:
        """A PUBLISH was handed to subscriber `name` (recorded): acknowledged by paho."""

    def _end_session(self, name: str, client: Client, rng: random.Random,
                     here: dict[str, str]) -> bool:
        """Whether subscriber `name` ends its session now (its connection is up and its
        stay is over); the next CONNECT then has Clean Start 1 and it subscribes again."""
        return False

    def _subscriber(self, name: str, home: str | None) -> None:
        config, stop = self.config, self._stop_subscribers
        rng = random.Random(f"{config.seed}-{name}")
        here = {"node": "?"}
        client = self._subscriber_client(name, here)
        self._track(client, True)
        subscribed = False  # the session holds the subscription
        clean = False  # the next CONNECT starts a new session
        try:
            while not stop.is_set():
                port = self.directory.port(home) if not subscribed and home else None
                target = (home, port) if home and port is not None else self.directory.pick(rng)
                if target is None:
                    stop.wait(0.2)
                    continue
                reached = self._connect(client, target, clean, here)
                if reached is None:
                    stop.wait(rng.uniform(0.1, 0.5))
                    continue
                node, connack = reached
                clean = False
                with self._lock:
                    self.stats.subscriber_connections += 1
                if not subscribed or not connack.session_present:
                    # The first time, or after the session ended; or the session is gone
                    # (recorded as lost by the Connected event): subscribe again so that
                    # the run goes on.
                    codes = client.subscribe(self.topic_filter, 2, config.connect_timeout)
                    if not codes or codes[0] > 2:
                        client.abort()
                        continue
                    if not subscribed:
                        subscribed = True
                        with self._lock:
                            self._homes[name] = node
                        self.recorder.record(Subscribed(name, node))
                ended = client.wait_ended(rng.uniform(*config.stay), stop)
                if ended:
                    client.finish()
                elif not stop.is_set() and self._end_session(name, client, rng, here):
                    subscribed, clean = False, True
                elif stop.is_set() or rng.random() >= config.abrupt:
                    client.disconnect()
                else:
                    client.abort()
        finally:
            client.disconnect()
            self._track(client, False)

    def _probe(self, timeout: float) -> None:
        """A QoS 1 message published on every node, again every half second, until every
        subscriber has it from every node: routes to the subscribers are in place."""
        deadline = time.monotonic() + timeout
        subscribers = set(self.recorder.subscribed())
        for node in self.directory.names():
            marker = f"probe:{node}:{uuid.uuid4().hex[:6]}".encode()
            client = Client(f"{self.run}-probe-{node}", self.config.version)
            try:
                while True:
                    port = self.directory.port(node)
                    if port is not None and not client.connected:
                        client.connect(port, clean_start=True, expiry=0, keepalive=5,
                                       timeout=self.config.connect_timeout,
                                       host=self.config.host)
                    if client.connected:
                        client.paho.publish(f"{self.prefix}/probe", marker, 1)

                    def arrived(marker: bytes = marker) -> bool:
                        with self._lock:
                            return self._probe_arrived(marker, subscribers)

                    if self.recorder.wait_for(arrived, 0.5):
                        break
                    if time.monotonic() > deadline:
                        raise AssertionError(f"the probe published on {node} did not reach"
                                             f" every subscriber in {timeout}s")
            finally:
                client.disconnect()

    def _probe_arrived(self, marker: bytes, subscribers: set[str]) -> bool:
        """(Under the lock) whether the probe `marker` reached where it should."""
        return all(marker in self._probes.get(s, set()) for s in subscribers)

    # ---- publishers ---------------------------------------------------------------------------
    def _publisher(self, name: str) -> None:
        config, stop = self.config, self._stop_publishers
        rng = random.Random(f"{config.seed}-{name}")
        topic = f"{self.prefix}/{name}"
        seq, conn = 0, 0
        resend: list[tuple[int, int]] = []  # (seq, qos) to send again, in order
        while not stop.is_set():
            target = self.directory.pick(rng, config.publisher_nodes)
            if target is None:
                stop.wait(0.2)
                continue
            inflight = _Inflight(conn + 1)
            client = Client(self._publisher_id(name), config.version,
                            on_publish=lambda mid, code, f=inflight: self._acked(name, f, mid,
                                                                                 code),
                            on_disconnect=lambda f=inflight: _notify(f.cond))
            self._track(client, True)
            try:
                reached = self._connect(client, target, True)
                if reached is None:
                    stop.wait(rng.uniform(0.1, 0.5))
                    continue
                conn += 1
                node = reached[0]
                with self._lock:
                    self.stats.publisher_connections += 1
                interval = 1.0 / config.rate
                while not stop.is_set():
                    with inflight.cond:
                        inflight.cond.wait_for(lambda f=inflight, c=client: not c.connected or
                                               len(f.open) < config.window or stop.is_set(),
                                               0.5)
                        if not client.connected:
                            break
                        if len(inflight.open) >= config.window or stop.is_set():
                            continue
                        if resend:
                            number, qos = resend.pop(0)
                        else:
                            seq += 1
                            number, qos = seq, 2 if rng.random() < config.qos2_share else 1
                        self.recorder.record(Attempt(name, number, qos, node, conn))
                        inflight.open[number] = qos
                    info = client.paho.publish(topic, payload(name, number), qos)
                    with inflight.cond:
                        if info.rc != paho_mqtt.MQTT_ERR_SUCCESS:
                            break  # not sent: its Fail comes below with the others
                        reason = inflight.early.pop(info.mid, None)
                        if reason is None:
                            inflight.by_mid[info.mid] = number
                        else:
                            self._resolve(name, inflight, number, reason)
                    stop.wait(interval)
                if stop.is_set() and client.connected:
                    with inflight.cond:  # the last acknowledgements, for a while
                        inflight.cond.wait_for(lambda f=inflight, c=client: not f.open or
                                               not c.connected, 5.0)
                    client.disconnect()
                else:
                    client.abort()
                with inflight.cond:
                    for number, qos in sorted(inflight.open.items()):
                        self.recorder.record(Fail(name, number, inflight.conn))
                        if config.resend and not stop.is_set():
                            resend.append((number, qos))
                    inflight.open.clear()
                resend.sort()
            finally:
                client.abort()
                self._track(client, False)

    def _publisher_id(self, name: str) -> str:
        return f"{self.run}-{name}"

    def _acked(self, name: str, inflight: _Inflight, mid: int, code: int) -> None:
        with inflight.cond:
            number = inflight.by_mid.pop(mid, None)
            if number is None:
                inflight.early[mid] = code
            else:
                self._resolve(name, inflight, number, code)

    def _resolve(self, name: str, inflight: _Inflight, number: int, code: int) -> None:
        if inflight.open.pop(number, None) is None:
            return
        if code >= 0x80:
            self.recorder.record(Fail(name, number, inflight.conn, f"reason code {code:#x}"))
        else:
            self.recorder.record(Ack(name, number, inflight.conn))
        inflight.cond.notify_all()


def run_together(workloads: list[Workload], seconds: float) -> None:
    """Lets the workloads run `seconds` (their clients' threads do the work); fails early if
    a client of one of them failed."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        workloads[0]._stop_publishers.wait(min(remaining, 0.2))
        for workload in workloads:
            workload._raise_errors()


def _notify(cond: threading.Condition) -> None:
    with cond:
        cond.notify_all()
