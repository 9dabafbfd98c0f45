"""A data volume that runs out of space, for real: a size-limited tmpfs the test mounts (as
root), a filler file that takes most of it (deleting it is how a test frees space), and a
raw MQTT 5 publisher that sends QoS 1 PUBLISHes until the broker stops acknowledging them.

The publisher is raw (tests/support/raw_mqtt.py) because the test must see exactly what the
broker answers: which PUBLISHes got a PUBACK (and with what reason code), and how the
connection ended (a DISCONNECT and its reason code, or a close without one).
"""

import contextlib
import os
import select
import socket
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.raw_mqtt import TIMEOUT, _remaining_length, _utf8, raw_connect, recv_packet

FILLER = "filler.bin"


@contextlib.contextmanager
def tmpfs(path: Path, size_mib: int) -> Iterator[Path]:
    """A tmpfs of `size_mib` MiB mounted at `path`, unmounted (lazily, if something still
    holds it) when the block ends, failed or not."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], check=False)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill(volume: Path, leave_mib: int) -> Path:
    """Writes a filler file that leaves about `leave_mib` MiB of the volume free."""
    filler = volume / FILLER
    size = max(0, free_bytes(volume) - (leave_mib << 20))
    with open(filler, "wb") as handle:
        handle.write(b"\0" * size)
    return filler


@dataclass
class Outcome:
    """What a publisher saw: the payload numbers acknowledged with success, any other
    PUBACK reason codes, and how the connection ended."""

    acked: set[int] = field(default_factory=set)
    refused_codes: list[int] = field(default_factory=list)
    disconnect_reason: int | None = None  # a DISCONNECT's reason code; None: closed without
    closed: bool = False


def _publish_packet(topic: str, packet_id: int, payload: bytes) -> bytes:
    body = _utf8(topic) + struct.pack(">H", packet_id) + b"\x00" + payload  # v5, no properties
    return bytes([0x32]) + _remaining_length(len(body)) + body


def payload(number: int, size: int) -> bytes:
    """Numbered, the rest random: LevelDB's compression must not shrink what fills the
    volume (a run of one byte compacts to almost nothing, and the volume may never fill)."""
    head = f"{number:08d}:".encode()
    return head + os.urandom(size - len(head))


def number_of(data: bytes) -> int:
    return int(data[:8])


def publish_until_refused(port: int, client_id: str, topic: str, first: int, *,
                          size: int = 4096, window: int = 32, limit: int = 100_000) -> Outcome:
    """Publishes payloads numbered from `first` at QoS 1, `window` unacknowledged at most,
    until the broker closes the connection (or `limit` are acknowledged)."""
    sock, _ = raw_connect(port, client_id, 60, version=5)
    outcome = Outcome()
    inflight: dict[int, int] = {}  # packet id -> payload number
    number = first
    try:
        while len(outcome.acked) < limit:
            while len(inflight) < window:
                packet_id = number % 65535 + 1
                inflight[packet_id] = number
                sock.sendall(_publish_packet(topic, packet_id, payload(number, size)))
                number += 1
            if not _read_acks(sock, inflight, outcome):
                break
    except (ConnectionError, OSError):
        outcome.closed = True
    finally:
        sock.close()
    return outcome


def publish_one(port: int, client_id: str, topic: str, number: int, size: int = 4096
                ) -> Outcome:
    """One QoS 1 PUBLISH; the connection is left once it is acknowledged or closed, or
    when the CONNECT is not answered (`closed`, with no DISCONNECT reason)."""
    outcome = Outcome()
    try:
        sock, _ = raw_connect(port, client_id, 60, version=5)
    except OSError:  # (TimeoutError included)
        outcome.closed = True
        return outcome
    try:
        sock.sendall(_publish_packet(topic, 1, payload(number, size)))
        _read_acks(sock, {1: number}, outcome)
    except (ConnectionError, OSError):
        outcome.closed = True
    finally:
        sock.close()
    return outcome


def _read_acks(sock: socket.socket, inflight: dict[int, int], outcome: Outcome) -> bool:
    """Reads what the broker sent (one packet at least); False once the connection ended."""
    readable, _, _ = select.select([sock], [], [], TIMEOUT * 6)
    if not readable:
        raise AssertionError(f"no answer to {len(inflight)} PUBLISHes in {TIMEOUT * 6}s")
    packet = recv_packet(sock)
    kind = packet[0] & 0xF0
    if kind == 0xE0:  # DISCONNECT
        outcome.disconnect_reason = packet[2] if len(packet) > 2 else 0
        outcome.closed = True
        return False
    assert kind == 0x40, f"expected PUBACK, got {packet!r}"
    start = 2  # remaining length is one byte for a PUBACK
    packet_id = struct.unpack_from(">H", packet, start)[0]
    code = packet[start + 2] if len(packet) > start + 2 else 0
    number = inflight.pop(packet_id)
    if code < 0x80:
        outcome.acked.add(number)
    else:
        outcome.refused_codes.append(code)
    return True
