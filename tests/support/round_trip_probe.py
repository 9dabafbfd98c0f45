"""A client that times its round trips to a broker while a test storms that broker with
other clients. It runs in a thread of its own with a blocking socket: driven from the
storm's event loop, its answers would wait behind a thousand of the test's own tasks,
and a slow round trip would measure the test, not the broker."""

import socket
import threading
import time
from collections.abc import Callable

from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import MQTT_5
from broker.mqtt.packets import Connack, Connect, Packet

ANSWER_TIMEOUT_S = 10.0  # a broker this slow to answer one packet has stalled


class RoundTripProbe:
    """Connects (with `username` and `password` if given), then sends `request(n)` for
    n = 0, 1, ... and waits after each for a packet `answered` accepts, until `stop`. The
    first round trip is made before the constructor returns, so whatever it makes the
    broker decide is decided before the storm. A failed round trip is raised by `stop`."""

    def __init__(self, port: int, client_id: str, request: Callable[[int], Packet],
                 answered: Callable[[Packet], bool], username: str | None = None,
                 password: bytes | None = None) -> None:
        self.slowest, self.rounds = 0.0, 0
        self._request, self._answered = request, answered
        self._decoder = Decoder(version=MQTT_5)
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
        self._sock.sendall(encode(Connect(client_id, MQTT_5, True, 60, username, password),
                                  MQTT_5))
        connack = self._next()
        assert isinstance(connack, Connack) and connack.reason_code == 0, connack
        self._round()
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _next(self) -> Packet:
        while not (packets := self._decoder.feed(data := self._sock.recv(4096))):
            if not data:
                raise EOFError("the broker closed the probe's connection")
        assert len(packets) == 1, packets
        return packets[0]

    def _round(self) -> None:
        started = time.monotonic()
        self._sock.sendall(encode(self._request(self.rounds), MQTT_5))
        answer = self._next()
        assert self._answered(answer), answer
        self.slowest = max(self.slowest, time.monotonic() - started)
        self.rounds += 1

    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                self._round()
                # The probe's pace, ended at once by `stop`: not a wait for an event.
                self._stopped.wait(0.05)
        except BaseException as error:  # re-raised by stop()
            self._error = error

    def stop(self) -> tuple[float, int]:
        """Ends the probe; its slowest round trip and how many it made."""
        self._stopped.set()
        self._thread.join(ANSWER_TIMEOUT_S * 2)
        self._sock.close()
        if self._error is not None:
            raise self._error
        return self.slowest, self.rounds
