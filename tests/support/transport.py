"""A transport stand-in that records what a `Connection` writes, one entry per write().

For driving real `Connection` objects in-process (unit tests, bench/pathcost.py) where the
subject is the broker's logic and batching, not the socket.
"""

from typing import Any


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return False
