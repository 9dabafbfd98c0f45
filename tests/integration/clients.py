"""Client-side helpers shared by the integration tests: paho, gmqtt, mosquitto CLI.

Everything here waits on conditions set from client callbacks (or on socket readiness), never
on the clock. `barrier()` is the way to prove that something was *not* delivered: the broker
writes to one connection in order, so once the SUBACK of a fresh subscription has arrived,
every PUBLISH the broker sent before it has been handed to the client's callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gmqtt
import paho.mqtt.client as paho_mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.support.broker_process import LISTENER, STARTED
from tests.support.raw_mqtt import HOST, TIMEOUT

BOTH = pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
"""Runs a test with MQTT 3.1.1 and 5.0 clients."""


# MQTT 5.0 reason codes (section 2.4) the tests look for.
SUCCESS = 0x00
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
PROTOCOL_ERROR = 0x82
CLIENT_ID_NOT_VALID = 0x85
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
PAYLOAD_FORMAT_INVALID = 0x99
QOS_NOT_SUPPORTED = 0x9B
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


def unique(prefix: str = "it") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def payloads(messages: Iterable[Any]) -> list[bytes]:
    return [m.payload for m in messages]


def wait_until(predicate: Callable[[], Any], timeout: float = TIMEOUT, what: str = "") -> Any:
    """Polls a condition that has no callback to wait on (HTTP state, a process exiting)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.01)


def wait_offline(http_port: int, client_id: str) -> None:
    """Waits until the broker has detached the client's session from its connection.

    A client's DISCONNECT and another client's PUBLISH travel on different sockets, so
    without this a message meant for the offline session can still go to the closing
    connection (and then come back with DUP=1 on resume).
    """
    def offline() -> bool:
        view = api_client(http_port, client_id)
        return view is not None and view["connected"] is False

    wait_until(offline, what=f"session {client_id} to be offline")


def wait_past(deadline: float) -> None:
    """Lets wall-clock time pass until `deadline` (time.time()): only for waiting out expiry."""
    remaining = deadline - time.time()
    if remaining > 0:
        time.sleep(remaining)


def props(packet_type: int, **values: Any) -> Properties:
    """paho Properties, e.g. props(PacketTypes.PUBLISH, ContentType="text/plain")."""
    properties = Properties(packet_type)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def publish_props(**values: Any) -> Properties:
    return props(PacketTypes.PUBLISH, **values)


# ---- paho -----------------------------------------------------------------------------------
@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool = False
    mid: int = 0
    properties: Any = None

    def prop(self, name: str, default: Any = None) -> Any:
        """A v5 property of the message, or `default` when the broker did not send it."""
        if self.properties is None:
            return default
        return getattr(self.properties, name, default)


@dataclass
class ConnectResult:
    reason_code: int
    session_present: bool
    properties: Any

    def prop(self, name: str, default: Any = None) -> Any:
        if self.properties is None:
            return default
        return getattr(self.properties, name, default)


class PahoClient:
    """A paho-mqtt client on its own network thread, with blocking, timed helpers.

    Automatic reconnection is off: a test that wants to reconnect creates a new client with
    the same ID, so nothing reconnects behind the test's back (which would e.g. cancel a
    delayed will or fight a session takeover).
    """

    def __init__(
        self,
        port: int,
        client_id: str = "",
        *,
        version: int = 5,
        transport: str = "tcp",
        ws_path: str = "/mqtt",
        clean_session: bool = True,
        manual_ack: bool = False,
    ) -> None:
        self.port = port
        self.version = version
        protocol = paho_mqtt.MQTTv5 if version == 5 else paho_mqtt.MQTTv311
        self.client = paho_mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=None if version == 5 else clean_session,
            protocol=protocol,
            transport=transport,  # type: ignore[arg-type]
            reconnect_on_failure=False,
            manual_ack=manual_ack,
        )
        if transport == "websockets":
            self.client.ws_set_options(path=ws_path)
        self.client_id = client_id
        self._cond = threading.Condition()
        self.connack: ConnectResult | None = None
        self.connected = False
        self.disconnect_reason: int | None = None
        self.disconnect_count = 0
        self.messages: list[Received] = []
        self._subacks: dict[int, list[int]] = {}
        self.suback_reason: str | None = None  # the last SUBACK's Reason String
        self._unsubacks: dict[int, list[int]] = {}
        self._published: dict[int, int] = {}
        self._started = False
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = self._on_unsubscribe
        self.client.on_publish = self._on_publish

    # ---- callbacks (network thread) ----
    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any,
                    properties: Any) -> None:
        with self._cond:
            self.connack = ConnectResult(
                int(reason_code.value), bool(flags.session_present), properties
            )
            self.connected = not reason_code.is_failure
            self._cond.notify_all()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason_code: Any,
                       properties: Any) -> None:
        with self._cond:
            self.connected = False
            self.disconnect_reason = int(reason_code.value)
            self.disconnect_count += 1
            self._cond.notify_all()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        received = Received(
            message.topic, bytes(message.payload), message.qos, bool(message.retain),
            bool(message.dup), message.mid, getattr(message, "properties", None),
        )
        with self._cond:
            self.messages.append(received)
            self._cond.notify_all()

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reason_codes: Any,
                      properties: Any) -> None:
        with self._cond:
            self._subacks[mid] = [int(code.value) for code in reason_codes]
            self.suback_reason = getattr(properties, "ReasonString", None)
            self._cond.notify_all()

    def _on_unsubscribe(self, client: Any, userdata: Any, mid: int, reason_codes: Any,
                        properties: Any) -> None:
        with self._cond:
            self._unsubacks[mid] = [int(code.value) for code in reason_codes]
            self._cond.notify_all()

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any,
                    properties: Any) -> None:
        with self._cond:
            self._published[mid] = int(reason_code.value)
            self._cond.notify_all()

    # ---- waiting ----
    def _wait(self, predicate: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
        with self._cond:
            result = self._cond.wait_for(predicate, timeout)
            if not result:
                raise AssertionError(
                    f"client {self.client_id or '(assigned)'}: timed out after {timeout}s"
                    f" waiting for {what}; received so far: {self.messages!r}"
                )
            return result

    # ---- operations ----
    def connect(
        self,
        *,
        clean_start: bool = True,
        keepalive: int = 30,
        properties: Properties | None = None,
        session_expiry: int | None = None,
        will: dict[str, Any] | None = None,
        expect_success: bool = True,
        timeout: float = TIMEOUT,
    ) -> ConnectResult:
        if session_expiry is not None:
            properties = properties or props(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = session_expiry
        if will is not None:
            self.client.will_set(**will)
        kwargs: dict[str, Any] = {"keepalive": keepalive, "properties": properties}
        if self.version == 5:
            kwargs["clean_start"] = clean_start
        self.client.connect(HOST, self.port, **kwargs)
        self.client.loop_start()
        self._started = True
        result = self._wait(lambda: self.connack, "CONNACK", timeout)
        if expect_success:
            assert result.reason_code == 0, f"CONNACK refused: {result}"
        return result

    def subscribe(
        self,
        topic: str | list[tuple[str, int]],
        qos: int = 0,
        *,
        no_local: bool = False,
        retain_as_published: bool = False,
        retain_handling: int = 0,
        sub_id: int | None = None,
        user_properties: list[tuple[str, str]] | None = None,
        timeout: float = TIMEOUT,
    ) -> list[int]:
        """SUBSCRIBE and wait for SUBACK; returns its reason codes (granted QoS or errors)."""
        properties = None
        if sub_id is not None or user_properties:
            properties = props(PacketTypes.SUBSCRIBE)
            if sub_id is not None:
                properties.SubscriptionIdentifier = sub_id
            if user_properties:
                properties.UserProperty = user_properties
        filters = [(topic, qos)] if isinstance(topic, str) else topic
        request: list[tuple[str, Any]] = []
        for topic_filter, filter_qos in filters:
            if self.version == 5:
                request.append((topic_filter, SubscribeOptions(
                    filter_qos, no_local, retain_as_published, retain_handling
                )))
            else:
                request.append((topic_filter, filter_qos))
        result, mid = self.client.subscribe(request, properties=properties)
        assert result == paho_mqtt.MQTT_ERR_SUCCESS, f"subscribe not sent: {result}"
        return self._wait(lambda: self._subacks.pop(mid, None), f"SUBACK {mid}", timeout)

    def unsubscribe(self, *topics: str) -> list[int]:
        result, mid = self.client.unsubscribe(list(topics))
        assert result == paho_mqtt.MQTT_ERR_SUCCESS, f"unsubscribe not sent: {result}"
        return self._wait(lambda: self._unsubacks.pop(mid, None), f"UNSUBACK {mid}")

    def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
        *,
        timeout: float = TIMEOUT,
    ) -> int:
        """Publishes and waits until paho reports it complete (written for QoS 0, PUBACK for
        QoS 1, PUBCOMP for QoS 2); returns the broker's reason code (0 for QoS 0)."""
        info = self.client.publish(topic, payload, qos, retain, properties)
        assert info.rc == paho_mqtt.MQTT_ERR_SUCCESS, f"publish not sent: {info.rc}"
        mid = info.mid
        return self._wait(
            lambda: mid in self._published and (self._published.pop(mid),), f"publish {mid}",
            timeout,
        )[0]

    def wait_messages(self, count: int, timeout: float = TIMEOUT) -> list[Received]:
        """Waits until at least `count` messages arrived; returns exactly the first `count`."""
        self._wait(lambda: len(self.messages) >= count, f"{count} message(s)", timeout)
        with self._cond:
            return list(self.messages[:count])

    def wait_message_on(self, topic: str, timeout: float = TIMEOUT) -> Received:
        def find() -> Received | None:
            return next((m for m in self.messages if m.topic == topic), None)

        return self._wait(find, f"a message on {topic!r}", timeout)

    def barrier(self) -> list[Received]:
        """SUBSCRIBE round trips on this connection; returns every message the broker sent before.

        Two of them: paho hands a QoS 2 message to on_message only on PUBREL. Its PUBREC goes
        out before the first SUBACK is read, so the broker's PUBREL precedes the second SUBACK.
        """
        self.subscribe(f"barrier/{uuid.uuid4().hex}", 0)
        self.subscribe(f"barrier/{uuid.uuid4().hex}", 0)
        with self._cond:
            return list(self.messages)

    def ack(self, mid: int, qos: int) -> None:
        self.client.ack(mid, qos)

    def wait_disconnected(self, timeout: float = TIMEOUT) -> int:
        """Waits until the broker (or the network) ended the connection; returns the reason."""
        self._wait(lambda: self.disconnect_count > 0, "disconnect", timeout)
        assert self.disconnect_reason is not None
        return self.disconnect_reason

    def disconnect(self, reason_code: int | None = None,
                   properties: Properties | None = None) -> None:
        """A normal DISCONNECT (optionally with a v5 reason code), then stop the thread."""
        reason = None
        if reason_code is not None:
            reason = ReasonCode(PacketTypes.DISCONNECT, identifier=reason_code)
        self.client.disconnect(reason, properties)
        self._wait(lambda: self.disconnect_count > 0, "own disconnect")
        self.client.loop_stop()

    def kill(self) -> None:
        """The client dies: its socket closes without DISCONNECT (RST, no FIN handshake)."""
        sock = self.client.socket()
        assert sock is not None, "not connected"
        sock = getattr(sock, "_socket", sock)  # paho wraps the TCP socket for websockets
        assert isinstance(sock, socket.socket)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
        self._wait(lambda: self.disconnect_count > 0, "socket loss noticed")
        self.client.loop_stop()

    def close(self) -> None:
        """Teardown: disconnect if still connected; safe to call more than once."""
        if not self._started:
            return
        self._started = False
        if self.connected:
            with contextlib.suppress(AssertionError):
                self.disconnect()
        self.client.loop_stop()


# ---- gmqtt (asyncio) --------------------------------------------------------------------------
@dataclass
class GReceived:
    topic: str
    payload: bytes
    qos: int
    properties: dict[str, Any] = field(default_factory=dict)

    @property
    def retain(self) -> bool:
        return bool(self.properties.get("retain"))


class GmqttClient:
    """A gmqtt client whose callbacks feed asyncio conditions; reconnection is off."""

    def __init__(self, port: int, client_id: str, *, version: int = 5, clean: bool = True,
                 **connect_properties: Any) -> None:
        self.port = port
        self.version = gmqtt.constants.MQTTv50 if version == 5 else gmqtt.constants.MQTTv311
        self.client = gmqtt.Client(client_id, clean_session=clean, **connect_properties)
        self.client.set_config({"reconnect_retries": 0, "reconnect_delay": 60})
        self.messages: list[GReceived] = []
        self.connack: tuple[int, int, dict[str, Any]] | None = None
        self.disconnected = False
        self._subacks: dict[int, tuple[int, ...]] = {}
        self._cond = asyncio.Condition()
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_disconnect = self._on_disconnect
        self._loop = asyncio.get_running_loop()

    def _notify(self) -> None:
        async def notify() -> None:
            async with self._cond:
                self._cond.notify_all()

        self._loop.create_task(notify())

    def _on_connect(self, client: Any, flags: int, rc: int, properties: dict[str, Any]) -> None:
        self.connack = (flags, rc, properties)
        self._notify()

    def _on_message(self, client: Any, topic: str, payload: bytes, qos: int,
                    properties: dict[str, Any]) -> int:
        self.messages.append(GReceived(topic, bytes(payload), qos, dict(properties)))
        self._notify()
        return 0

    def _on_subscribe(self, client: Any, mid: int, qos: tuple[int, ...],
                      properties: dict[str, Any]) -> None:
        self._subacks[mid] = tuple(qos)
        self._notify()

    def _on_disconnect(self, client: Any, packet: Any, exc: Any = None) -> None:
        self.disconnected = True
        self._notify()

    async def _wait(self, predicate: Callable[[], Any], what: str,
                    timeout: float = TIMEOUT) -> Any:
        async with self._cond:
            try:
                return await asyncio.wait_for(self._cond.wait_for(predicate), timeout)
            except TimeoutError:
                raise AssertionError(
                    f"gmqtt: timed out waiting for {what}; received {self.messages!r}"
                ) from None

    async def connect(self, keepalive: int = 30) -> tuple[int, int, dict[str, Any]]:
        await asyncio.wait_for(
            self.client.connect(HOST, self.port, keepalive=keepalive, version=self.version),
            TIMEOUT,
        )
        return await self._wait(lambda: self.connack, "CONNACK")

    async def subscribe(self, topic: str, qos: int = 0, **options: Any) -> tuple[int, ...]:
        mid = self.client.subscribe(topic, qos, **options)
        return await self._wait(lambda: self._subacks.pop(mid, None), f"SUBACK {mid}")

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                **properties: Any) -> None:
        self.client.publish(topic, payload, qos=qos, retain=retain, **properties)

    async def wait_messages(self, count: int, timeout: float = TIMEOUT) -> list[GReceived]:
        await self._wait(lambda: len(self.messages) >= count, f"{count} message(s)", timeout)
        return self.messages[:count]

    async def barrier(self) -> list[GReceived]:
        await self.subscribe(f"barrier/{uuid.uuid4().hex}", 0)
        return list(self.messages)

    async def close(self) -> None:
        if self.connack is not None and not self.disconnected:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.disconnect(), TIMEOUT)


# ---- mosquitto_pub / mosquitto_sub ----------------------------------------------------------
_MSG = "MSG\t"
# Topic, payload, retain flag, QoS, v5 user properties, payload length.
_FORMAT = _MSG + "%t\t%p\t%r\t%q\t%P\t%l"


@dataclass
class MosqMessage:
    topic: str
    payload: str
    retain: bool
    qos: int
    user_properties: str
    length: int


class MosquittoSub:
    """A running mosquitto_sub; `start()` returns once its SUBACK arrived (from its -d log)."""

    def __init__(self, port: int, topics: Iterable[str], *, version: str = "mqttv311",
                 qos: int = 0, extra: Iterable[str] = ()) -> None:
        # stdbuf: line-buffered stdout, or the -d log would sit in a pipe buffer.
        self.args = ["stdbuf", "-oL", "mosquitto_sub", "-d", "-h", HOST, "-p", str(port),
                     "-V", version, "-q", str(qos), "-F", _FORMAT, *extra]
        for topic in topics:
            self.args += ["-t", topic]
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.messages: list[MosqMessage] = []
        self._cond = threading.Condition()
        self._subscribed = False
        self._eof = False

    def start(self, wait_for_suback: bool = True) -> MosquittoSub:
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._read, daemon=True).start()
        if not wait_for_suback:
            return self
        with self._cond:
            ok = self._cond.wait_for(lambda: self._subscribed or self._eof, TIMEOUT)
        assert ok and self._subscribed, f"mosquitto_sub did not subscribe: {self.lines}"
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            with self._cond:
                self.lines.append(line)
                if "received SUBACK" in line:
                    self._subscribed = True
                if line.startswith(_MSG):
                    topic, payload, retain, qos, user, length = line[len(_MSG):].split("\t")
                    self.messages.append(
                        MosqMessage(topic, payload, retain == "1", int(qos), user, int(length))
                    )
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_messages(self, count: int, timeout: float = TIMEOUT) -> list[MosqMessage]:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.messages) >= count, timeout)
            assert ok, f"mosquitto_sub: wanted {count} messages, output: {self.lines}"
            return list(self.messages[:count])

    def wait_exit(self, timeout: float = TIMEOUT) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        with self._cond:
            self._cond.wait_for(lambda: self._eof, timeout)
        return code

    def kill(self) -> None:
        """SIGKILL: the process dies without sending DISCONNECT; the kernel closes the socket."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(TIMEOUT)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()


def mosquitto_pub(port: int, topic: str, message: str | None, *, version: str = "mqttv311",
                  qos: int = 0, retain: bool = False, extra: Iterable[str] = ()) -> None:
    args = ["mosquitto_pub", "-h", HOST, "-p", str(port), "-V", version, "-q", str(qos),
            "-t", topic]
    args += ["-n"] if message is None else ["-m", message]
    if retain:
        args.append("-r")
    args += list(extra)
    result = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"mosquitto_pub failed: {result.stdout}{result.stderr}"


# ---- HTTP API ---------------------------------------------------------------------------------
def http_get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=TIMEOUT) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def http_send(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(status, JSON body or None) of a POST/DELETE to the HTTP API."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{HOST}:{port}{path}", data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    return status, json.loads(raw) if raw else None


def http_json(port: int, path: str, status: int = 200) -> Any:
    code, _, body = http_get(port, path)
    assert code == status, f"GET {path}: {code} {body!r}"
    return json.loads(body)


def api_client(http_port: int, client_id: str) -> dict[str, Any] | None:
    """The API's view of one client, or None when the broker has no session for it."""
    code, _, body = http_get(http_port, f"/api/v5/clients/{client_id}")
    if code == 404:
        return None
    assert code == 200, f"GET client {client_id}: {code} {body!r}"
    result: dict[str, Any] = json.loads(body)
    return result


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def scrape_metrics(http_port: int) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value}."""
    code, _, body = http_get(http_port, "/metrics")
    assert code == 200, f"/metrics: {code}"
    samples: dict[str, float] = {}
    for line in body.decode().splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


# ---- the broker CLI as a plain subprocess (for tests of the command itself) -------------------


class CliBroker:
    """`python -m broker run ARGS...` with whatever arguments the test gives (e.g. --config)."""

    def __init__(self, *args: str) -> None:
        self.args = [sys.executable, "-m", "broker", *args]
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.ports: dict[str, int] = {}
        self._cond = threading.Condition()
        self._started = False
        self._eof = False

    def start(self) -> CliBroker:
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=Path(__file__).parents[2],
        )
        threading.Thread(target=self._read, daemon=True).start()
        with self._cond:
            self._cond.wait_for(lambda: self._started or self._eof, 20)
        assert self._started, "broker did not start:\n" + "\n".join(self.lines)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip())
                match = LISTENER.search(line)
                if match:
                    self.ports[(match.group(1) or "http").lower()] = int(match.group(3))
                if STARTED.search(line):
                    self._started = True
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def terminate(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_cli(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    """Runs the broker CLI to completion (for invocations expected to exit by themselves)."""
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], capture_output=True, text=True,
        timeout=timeout, cwd=Path(__file__).parents[2],
    )
