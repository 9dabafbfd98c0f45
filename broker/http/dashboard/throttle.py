"""Failed dashboard logins counted per client address, so a password cannot be guessed at
the speed of the network: `max_attempts` failures within `interval` lock the address out for
`lock_duration` (EMQX's `dashboard.unsuccessful_login_*` keys, which EMQX applies per user
name; per address here, so a stranger's guesses cannot lock the administrator out from
their own desk). A locked address is refused even with the right password, or a guesser
would learn from the answer when it hit.

Pure state, fed the time by its caller. At most `max_addresses` addresses are remembered:
past that the oldest entry is forgotten, so a flood from many addresses costs bounded
memory (and at worst frees the oldest lock early).
"""

from dataclasses import dataclass, field
from typing import Final

MAX_ADDRESSES: Final = 10_000


@dataclass(slots=True)
class _Failures:
    times: list[float] = field(default_factory=list)  # within the interval, oldest first
    locked_until: float = 0.0


class LoginThrottle:
    def __init__(self, max_attempts: int, interval: float, lock_duration: float,
                 max_addresses: int = MAX_ADDRESSES) -> None:
        self.max_attempts = max_attempts
        self.interval = interval
        self.lock_duration = lock_duration
        self._max_addresses = max_addresses
        self._by_address: dict[str, _Failures] = {}

    def locked_for(self, address: str, now: float) -> float | None:
        """Seconds until `address` may try again; None when it may now."""
        failures = self._by_address.get(address)
        if failures is None or failures.locked_until <= now:
            return None
        return failures.locked_until - now

    def failed(self, address: str, now: float) -> None:
        failures = self._by_address.pop(address, None) or _Failures()
        self._by_address[address] = failures  # (re)inserted last: the newest entry
        failures.times = [t for t in failures.times if t > now - self.interval] + [now]
        if len(failures.times) >= self.max_attempts:
            failures.locked_until = now + self.lock_duration
            failures.times.clear()  # the lock's end starts a new count
        while len(self._by_address) > self._max_addresses:
            del self._by_address[next(iter(self._by_address))]  # dicts keep insertion order

    def succeeded(self, address: str) -> None:
        self._by_address.pop(address, None)
