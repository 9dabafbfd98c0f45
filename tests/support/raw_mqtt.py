"""Raw MQTT over a socket, for tests where a client library cannot misbehave on purpose:
a CONNECT with a will, a SUBSCRIBE the library would refuse, a client that never reads or
never pings, whatever the broker sends until it closes.

The bytes are built here by hand, not with broker.mqtt, so a codec bug cannot hide itself.
"""

import select
import socket
import struct
import time

HOST = "127.0.0.1"  # every broker a test starts listens on loopback
TIMEOUT = 5.0  # seconds a test waits for the broker's answer


def _utf8(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def _remaining_length(length: int) -> bytes:
    out = bytearray()
    while True:
        byte, length = length % 128, length // 128
        out.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(out)


def raw_connect_packet(client_id: str, keepalive: int, version: int = 4, clean: bool = True,
                       will: tuple[str, bytes, int] | None = None) -> bytes:
    """CONNECT; `will` is (topic, payload, qos)."""
    flags = 0x02 if clean else 0x00
    if will is not None:
        flags |= 0x04 | (will[2] << 3)
    body = _utf8("MQTT") + bytes([version, flags]) + struct.pack(">H", keepalive)
    if version == 5:
        body += b"\x00"  # no properties
    body += _utf8(client_id)
    if will is not None:
        if version == 5:
            body += b"\x00"  # no will properties
        body += _utf8(will[0]) + struct.pack(">H", len(will[1])) + will[1]
    return bytes([0x10]) + _remaining_length(len(body)) + body


PINGREQ = b"\xc0\x00"
PINGRESP = b"\xd0\x00"


def raw_connect(port: int, client_id: str, keepalive: int, version: int = 4,
                clean: bool = True, will: tuple[str, bytes, int] | None = None
                ) -> tuple[socket.socket, bytes]:
    """Connects and sends CONNECT; returns the socket and the CONNACK bytes."""
    sock = socket.create_connection((HOST, port), timeout=TIMEOUT)
    sock.sendall(raw_connect_packet(client_id, keepalive, version, clean, will))
    connack = recv_packet(sock)
    assert connack[:1] == b"\x20", f"expected CONNACK, got {connack!r}"
    return sock, connack


def raw_subscribe(sock: socket.socket, packet_id: int, filters: list[tuple[str, int]],
                  version: int = 4) -> list[int]:
    """Sends SUBSCRIBE (no validation on our side) and returns the SUBACK reason codes."""
    body = struct.pack(">H", packet_id) + (b"\x00" if version == 5 else b"")
    for topic_filter, options in filters:
        body += _utf8(topic_filter) + bytes([options])
    sock.sendall(bytes([0x82]) + _remaining_length(len(body)) + body)
    suback = recv_packet(sock)
    assert suback[:1] == b"\x90", f"expected SUBACK, got {suback!r}"
    start = 2 if suback[1] < 0x80 else 3  # remaining length is 1 byte for these sizes
    assert suback[start:start + 2] == struct.pack(">H", packet_id)
    codes = suback[start + 2:]
    return list(codes[1:] if version == 5 else codes)


def recv_exact(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"connection closed after {data!r}")
        data += chunk
    return data


def recv_packet(sock: socket.socket) -> bytes:
    """One whole MQTT packet (fixed header included)."""
    first = recv_exact(sock, 1)
    length, multiplier, header = 0, 1, first
    while True:
        byte = recv_exact(sock, 1)
        header += byte
        length += (byte[0] & 0x7F) * multiplier
        multiplier *= 128
        if not byte[0] & 0x80:
            break
    return header + recv_exact(sock, length)


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """Everything the broker sends until it closes the connection."""
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"connection still open after {timeout}s; got {data!r}")
        readable, _, _ = select.select([sock], [], [], remaining)
        if readable:
            try:
                chunk = sock.recv(4096)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk
