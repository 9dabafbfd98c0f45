"""A SCRAM client (RFC 5802, RFC 7677) and MQTT 5 AUTH exchanges over a raw socket, written
from the RFCs and the MQTT 5.0 specification alone, with nothing of `broker` imported: the
broker's SCRAM and AUTH handling are tested against a client that is not theirs (and this
client against the RFC's test vector, tests/unit/auth/test_scram.py)."""

import base64
import functools
import hashlib
import hmac
import secrets
import socket
import struct

from tests.support.raw_mqtt import HOST, TIMEOUT, _remaining_length, _utf8, recv_packet

AUTH_METHOD, AUTH_DATA, REASON_STRING = 0x15, 0x16, 0x1F


@functools.lru_cache(maxsize=1024)
def _salted(algorithm: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    """SaltedPassword, kept per password and salt as RFC 5802 (section 5.1) lets a client
    keep it: a benchmark's client must not spend its time in PBKDF2."""
    return hashlib.pbkdf2_hmac(algorithm, password, salt, iterations)


class ScramClient:
    def __init__(self, username: str, password: str, algorithm: str = "sha256",
                 nonce: str | None = None) -> None:
        self.username, self.password, self.algorithm = username, password, algorithm
        self.nonce = nonce or secrets.token_urlsafe(18)
        self._bare = "n=" + username.replace("=", "=3D").replace(",", "=2C") + ",r=" + self.nonce
        self._server_signature = b""

    @property
    def method(self) -> str:
        return "SCRAM-" + self.algorithm.upper().replace("SHA", "SHA-")

    def first(self) -> bytes:
        return ("n,," + self._bare).encode()

    def final(self, server_first: bytes) -> bytes:
        fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
        assert fields["r"].startswith(self.nonce), "the server's nonce must extend ours"
        salted = _salted(self.algorithm, self.password.encode(), base64.b64decode(fields["s"]),
                         int(fields["i"]))
        client_key = hmac.digest(salted, b"Client Key", self.algorithm)
        stored_key = hashlib.new(self.algorithm, client_key).digest()
        without_proof = "c=biws,r=" + fields["r"]
        auth_message = f"{self._bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.digest(stored_key, auth_message, self.algorithm)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", self.algorithm)
        self._server_signature = hmac.digest(server_key, auth_message, self.algorithm)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        """Whether the server proved it knows the ServerKey (RFC 5802 section 3)."""
        return server_final == b"v=" + base64.b64encode(self._server_signature)


def _properties(method: str, data: bytes | None) -> bytes:
    props = bytes([AUTH_METHOD]) + _utf8(method)
    if data is not None:
        props += bytes([AUTH_DATA]) + struct.pack(">H", len(data)) + data
    return _remaining_length(len(props)) + props


def connect_packet(client_id: str, method: str, data: bytes | None,
                   username: str | None = None, password: bytes | None = None) -> bytes:
    flags = 0x02 | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = _utf8("MQTT") + bytes([5, flags]) + struct.pack(">H", 30) + _properties(method, data)
    body += _utf8(client_id)
    if username is not None:
        body += _utf8(username)
    if password is not None:
        body += struct.pack(">H", len(password)) + password
    return b"\x10" + _remaining_length(len(body)) + body


def auth_packet(reason: int, method: str, data: bytes | None) -> bytes:
    body = bytes([reason]) + _properties(method, data)
    return b"\xf0" + _remaining_length(len(body)) + body


class Reply:
    """A CONNACK, AUTH or DISCONNECT: its type, reason code and properties we look at."""

    def __init__(self, packet: bytes) -> None:
        self.type = packet[0] >> 4
        length_bytes = 1
        while packet[length_bytes] & 0x80:
            length_bytes += 1
        body = packet[1 + length_bytes:]
        if self.type == 2:  # CONNACK: acknowledge flags, then the reason code
            body = body[1:]
        self.reason = body[0] if body else 0
        self.properties: dict[int, bytes | str] = {}
        if len(body) > 1:
            self._parse_properties(body[1:])

    def _parse_properties(self, data: bytes) -> None:
        length, shift, index = 0, 0, 0
        while True:
            byte = data[index]
            length |= (byte & 0x7F) << shift
            index += 1
            shift += 7
            if not byte & 0x80:
                break
        end = index + length
        while index < end:
            identifier = data[index]
            index += 1
            if identifier in (0x11, 0x27):  # four-byte integers
                index += 4
            elif identifier in (0x21, 0x22, 0x13):  # two-byte integers
                index += 2
            elif identifier in (0x24, 0x25, 0x28, 0x29, 0x2A):  # bytes
                index += 1
            elif identifier == 0x26:  # user property: two strings
                for _ in range(2):
                    size = struct.unpack(">H", data[index:index + 2])[0]
                    index += 2 + size
            else:  # strings and binary data
                size = struct.unpack(">H", data[index:index + 2])[0]
                value = data[index + 2:index + 2 + size]
                self.properties[identifier] = (
                    value if identifier == AUTH_DATA else value.decode())
                index += 2 + size

    @property
    def data(self) -> bytes:
        value = self.properties.get(AUTH_DATA, b"")
        assert isinstance(value, bytes)
        return value


def open_socket(port: int) -> socket.socket:
    return socket.create_connection((HOST, port), timeout=TIMEOUT)


def reply(sock: socket.socket) -> Reply:
    return Reply(recv_packet(sock))


def scram_connect(port: int, client: ScramClient, client_id: str) -> tuple[socket.socket, Reply]:
    """CONNECT, AUTH 0x18, the final answer (a CONNACK, whose data the client checks)."""
    sock = open_socket(port)
    sock.sendall(connect_packet(client_id, client.method, client.first()))
    challenge = reply(sock)
    if challenge.type != 15:
        return sock, challenge
    assert challenge.reason == 0x18 and challenge.properties[AUTH_METHOD] == client.method
    sock.sendall(auth_packet(0x18, client.method, client.final(challenge.data)))
    return sock, reply(sock)
