"""The well-behaved client of the network fuzzer: what the broker owes to everyone else
while one client after another sends it garbage.

A paho-mqtt client (3.1.1 or 5.0) subscribes to its own topic with QoS 1 and publishes a
numbered QoS 1 message to it at a fixed pace; each one must come back, once, within the
bound. Paho runs its network loop in its own thread, so the fuzzer's event loop and this
client do not wait on each other.
"""

import threading
import time
from dataclasses import dataclass

import paho.mqtt.client as paho_mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode


@dataclass(slots=True)
class GoodStats:
    name: str
    sent: int
    received: int
    missing: int  # not back within the bound after publishing stopped
    duplicates: int
    disconnects: int
    max_latency: float
    p99_latency: float

    def render(self) -> str:
        return (f"{self.name}: {self.sent:,} sent, {self.received:,} back, {self.missing} missing, "
                f"{self.duplicates} duplicates, {self.disconnects} disconnects, "
                f"latency max {self.max_latency:.3f} s, p99 {self.p99_latency:.3f} s")


class GoodClient:
    def __init__(self, port: int, version: int, name: str, interval: float = 0.05) -> None:
        protocol = paho_mqtt.MQTTv5 if version == 5 else paho_mqtt.MQTTv311
        self.name = name
        self.topic = f"good/{name}"
        self.port = port
        self.interval = interval
        self.client = paho_mqtt.Client(CallbackAPIVersion.VERSION2, client_id=name,
                                       protocol=protocol)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.on_disconnect = self._on_disconnect
        self._lock = threading.Condition()
        self._in_flight: dict[int, float] = {}  # number -> when published, until back
        self._latencies: list[float] = []
        self._sent = 0
        self._duplicates = 0
        self._disconnects = 0
        self._subscribed = threading.Event()
        self._stop = threading.Event()
        self._stopping = False
        self._publisher = threading.Thread(target=self._publish_loop, daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        self.client.connect("127.0.0.1", self.port, keepalive=30)
        self.client.loop_start()
        if not self._subscribed.wait(timeout):
            raise RuntimeError(f"good client {self.name} not subscribed within {timeout} s")
        self._publisher.start()

    def stop(self, bound: float) -> GoodStats:
        """Stops publishing, gives the last messages `bound` to come back, disconnects."""
        self._stop.set()
        self._publisher.join()
        with self._lock:
            self._lock.wait_for(lambda: not self._in_flight, bound)
            self._stopping = True
            now = time.monotonic()
            late = [now - sent for sent in self._in_flight.values()]
        self.client.disconnect()
        self.client.loop_stop()
        latencies = sorted(self._latencies + late)
        return GoodStats(
            self.name, self._sent, len(self._latencies), len(late), self._duplicates,
            self._disconnects, latencies[-1] if latencies else 0.0,
            latencies[int(len(latencies) * 0.99)] if latencies else 0.0,
        )

    def lag(self) -> float:
        """How long the oldest message not back yet has been out (0: none is)."""
        with self._lock:
            oldest = min(self._in_flight.values(), default=None)
        return 0.0 if oldest is None else time.monotonic() - oldest

    def _publish_loop(self) -> None:
        number = 0
        while not self._stop.wait(self.interval):  # the pace, not a wait for an event
            number += 1
            with self._lock:
                self._in_flight[number] = time.monotonic()
                self._sent += 1
            self.client.publish(f"{self.topic}/{number}", str(number).encode(), qos=1)

    def _on_connect(self, client: paho_mqtt.Client, userdata: object, flags: object,
                    reason: ReasonCode, properties: object) -> None:
        if not reason.is_failure:
            client.subscribe(f"{self.topic}/#", qos=1)

    def _on_subscribe(self, client: paho_mqtt.Client, userdata: object, mid: int,
                      reasons: list[ReasonCode], properties: object) -> None:
        if all(not r.is_failure for r in reasons):
            self._subscribed.set()

    def _on_message(self, client: paho_mqtt.Client, userdata: object,
                    message: paho_mqtt.MQTTMessage) -> None:
        now = time.monotonic()
        with self._lock:
            sent = self._in_flight.pop(int(message.payload), None)
            if sent is None:
                self._duplicates += 1
            else:
                self._latencies.append(now - sent)
            self._lock.notify_all()

    def _on_disconnect(self, client: paho_mqtt.Client, userdata: object, flags: object,
                       reason: ReasonCode, properties: object) -> None:
        with self._lock:
            if not self._stopping:
                self._disconnects += 1
