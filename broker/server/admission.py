"""Which new connections a listener takes: at most `max_connections` open at once and
`max_conn_rate` accepted per second (EMQX's listener keys). Pure: the caller passes the
time.

A refused socket is aborted before anything is read from it, so a flood of connection
attempts costs one accept and one close each, never a Connection or a decoder.
"""

from dataclasses import dataclass


@dataclass(slots=True)
class ListenerGate:
    name: str
    max_connections: int  # 0 = no limit
    max_rate: int  # new connections per second; 0 = no limit
    open: int = 0
    _tokens: float = 0.0
    _refilled: float = 0.0

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
