"""Which new connections a listener takes: at most `max_connections` open at once and
`max_conn_rate` accepted per second (EMQX's listener keys). Pure: the caller passes the
time.

A refused socket is aborted before anything is read from it, so a flood of connection
attempts costs one accept and one close each, never a Connection or a decoder.
"""


class ListenerGate:
    """(A plain class: a dataclass costs a start ~0.5 ms to build, issue 42.)"""

    __slots__ = ("_refilled", "_tokens", "max_connections", "max_rate", "name", "open")

    def __init__(self, name: str, max_connections: int, max_rate: int) -> None:
        self.name = name
        self.max_connections = max_connections  # 0 = no limit
        self.max_rate = max_rate  # new connections per second; 0 = no limit
        self.open = 0
        self._tokens = 0.0
        self._refilled = 0.0

    def admit(self, now: float) -> str | None:
        """None when the connection may proceed (and is counted), else the limit that
        refused it."""
        if self.max_connections and self.open >= self.max_connections:
            return "max_connections"
        if self.max_rate:
            # A bucket of one second's worth: bursts up to the rate, then the rate.
            self._tokens = min(float(self.max_rate),
                               self._tokens + (now - self._refilled) * self.max_rate)
            self._refilled = now
            if self._tokens < 1.0:
                return "max_conn_rate"
            self._tokens -= 1.0
        self.open += 1
        return None

    def release(self) -> None:
        self.open -= 1
