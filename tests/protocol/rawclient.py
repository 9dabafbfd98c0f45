"""A minimal blocking MQTT client on a raw socket, for byte-level protocol tests.

Third-party clients hide protocol errors; this one sends exactly the bytes a test wants and
returns exactly the packets the broker answers, so reason codes can be asserted.
"""

import socket

from broker.mqtt.codec import Decoder, encode
from broker.mqtt.packets import Connack, Connect, Packet


class RawClient:
    def __init__(self, port: int, version: int = 5, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.version = version
        self.decoder = Decoder(version=version)
        self.pending: list[Packet] = []

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, self.version))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> Packet:
        """The next packet; raises ConnectionError if the broker closed the socket first."""
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by broker")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def connect(self, client_id: str = "raw", **fields: object) -> Connack:
        self.send(Connect(client_id, protocol_level=self.version, **fields))  # type: ignore[arg-type]
        connack = self.recv()
        assert isinstance(connack, Connack), connack
        return connack

    def closed_by_broker(self) -> bool:
        """True once the broker closed the connection (after any pending packets)."""
        try:
            while True:
                self.recv()
        except (ConnectionError, OSError):
            return True

    def close(self) -> None:
        self.sock.close()
