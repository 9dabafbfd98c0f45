"""A connection the broker ends with a reason ends gracefully: a client still sending reads
the reason (paho's test_flow_control2: a v5 client past our Receive Maximum, whose send
queue still holds more), and the socket still goes within a bounded time."""

import socket
import time
from collections.abc import Callable

from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import ReasonCode
from broker.mqtt.packets import Disconnect, Publish, Pubrec
from broker.server.connection import CLOSE_LINGER
from tests.protocol.rawclient import RawClient

RECEIVE_MAXIMUM = 32  # mqtt.max_inflight's default


def read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_client_still_sending_reads_the_disconnect_reason(
        client: Callable[..., RawClient]) -> None:
    """33 QoS 2 PUBLISHes without PUBREL (the 33rd is one past Receive Maximum), then 8 MB
    more in the same write, before the client reads anything. Closed at once, the broker's
    socket answered the unread input with a reset: this write failed (EPIPE/ECONNRESET) and
    the DISCONNECT was lost."""
    raw = client()
    raw.connect("still-sending")
    burst = b"".join(encode(Publish("t/rm", b"x", qos=2, packet_id=i), 5)
                     for i in range(1, RECEIVE_MAXIMUM + 2))
    more = encode(Publish("t/rm", b"y" * 65_000, qos=0), 5) * 128
    raw.sock.settimeout(10)
    raw.sock.sendall(burst + more)
    received = Decoder(version=5).feed(read_to_eof(raw.sock))
    *acks, last = received
    assert [(type(a), a.packet_id) for a in acks] == [  # type: ignore[attr-defined]
        (Pubrec, i) for i in range(1, RECEIVE_MAXIMUM + 1)]
    assert last == Disconnect(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)


def test_the_socket_goes_after_the_linger_even_if_the_client_never_stops(
        client: Callable[..., RawClient]) -> None:
    """The broker's side is shut at once (EOF after the reason); a client that never
    closes its own is cut off (a reset) after CLOSE_LINGER, not kept."""
    raw = client()
    raw.connect("never-stops")
    raw.send_raw(encode(Publish("t/#", b"", qos=0), 5))  # a wildcard in a topic name
    raw.sock.settimeout(5)
    assert Decoder(version=5).feed(read_to_eof(raw.sock)) == [
        Disconnect(ReasonCode.TOPIC_NAME_INVALID)]
    start = time.monotonic()
    chunk = encode(Publish("t/x", b"z" * 4096, qos=0), 5)
    try:
        while time.monotonic() - start < CLOSE_LINGER + 5:
            raw.sock.sendall(chunk)
            time.sleep(0.01)
    except (BrokenPipeError, ConnectionResetError):
        cut = time.monotonic() - start
    else:
        raise AssertionError("the broker still reads a connection it ended")
    assert CLOSE_LINGER - 0.5 < cut < CLOSE_LINGER + 2, cut
