"""Per-client rate limits: `messages_rate` (PUBLISH packets received) and `bytes_rate` (bytes
received), EMQX's listener keys, as token buckets. Pure: the caller passes the time.

A bucket holds one period's worth (`1000/s`: 1000; `10/100ms`: 10) and refills at the rate.
What a read brings is charged after it was handled, so a bucket may go into debt; the caller
then stops reading for as long as the refill takes to pay the debt back (`charge` says how
long). Nothing is dropped or refused: the client's data waits in its socket, and TCP slows
it down.
"""

from typing import NamedTuple

from broker.config.loader import Config
from broker.config.values import Rate


class TokenBucket:
    __slots__ = ("capacity", "rate", "stamp", "tokens")

    def __init__(self, rate: Rate, now: float) -> None:
        amount, period = rate
        self.capacity = amount
        self.rate = amount / period  # per second
        self.tokens = amount
        self.stamp = now

    def take(self, amount: float, now: float) -> float:
        """Spends `amount` (the balance may go below zero); returns the seconds until the
        balance is back to zero, 0.0 when it is not in debt."""
        tokens = self.tokens + (now - self.stamp) * self.rate
        if tokens > self.capacity:
            tokens = self.capacity
        tokens -= amount
        self.tokens = tokens
        self.stamp = now
        return -tokens / self.rate if tokens < 0.0 else 0.0


class RateLimiter:
    """One connection's buckets (either may be absent)."""

    __slots__ = ("bytes", "messages", "names")

    def __init__(self, messages: TokenBucket | None, bytes_: TokenBucket | None,
                 names: tuple[str, str]) -> None:
        self.messages = messages
        self.bytes = bytes_
        self.names = names  # what each limit is counted as when it throttles

    def charge(self, now: float, messages: int, size: int) -> tuple[float, str]:
        """What one read brought: (seconds to stop reading, 0.0 for none; the limit that
        asks for the longest pause)."""
        wait, limit = 0.0, ""
        if self.messages is not None and messages:
            wait = self.messages.take(messages, now)
            if wait:
                limit = self.names[0]
        if self.bytes is not None:
            bytes_wait = self.bytes.take(size, now)
            if bytes_wait > wait:
                wait, limit = bytes_wait, self.names[1]
        return wait, limit


class ClientRates(NamedTuple):
    """A listener's per-client limits, read once; each connection gets its own buckets. (A
    NamedTuple: a frozen dataclass costs a start ~0.7 ms to build, issue 42.)"""

    listener: str
    messages: Rate | None
    bytes: Rate | None

    @classmethod
    def from_config(cls, config: Config, listener: str) -> "ClientRates":
        prefix = f"listeners.{listener}.default."
        return cls(listener, config[prefix + "messages_rate"], config[prefix + "bytes_rate"])

    def limiter(self, now: float) -> RateLimiter | None:
        """A new connection's buckets, full; None when neither limit is set."""
        if self.messages is None and self.bytes is None:
            return None
        return RateLimiter(
            None if self.messages is None else TokenBucket(self.messages, now),
            None if self.bytes is None else TokenBucket(self.bytes, now),
            (f"{self.listener}.messages_rate", f"{self.listener}.bytes_rate"))
