"""Optimistic transactions for state (the `sessions` database).

A transaction records what it read (keys and key prefixes), what it will write and what must
hold at commit (a key exists, does not exist, has a value). Commit checks, in one step on the
event loop, that no transaction committed since this one began wrote anything it read, and
that the preconditions hold on the latest state; then its writes go to disk as one atomic
batch. A loser gets `Conflict` or `PreconditionFailed` and retries from the start: cheap when,
as with sessions, transactions rarely touch the same keys.
"""

from collections.abc import Callable, Iterable


class TxAborted(Exception):
    pass


class Conflict(TxAborted):
    """Something this transaction read was written by a transaction committed since it
    began."""


class PreconditionFailed(TxAborted):
    pass


Getter = Callable[[bytes], bytes | None]
Scanner = Callable[[bytes], list[tuple[bytes, bytes]]]
_EXISTS = object()
_ABSENT = object()


class Transaction:
    """(A plain class, weakly referenced by KVStore: a dataclass costs a start ~0.5 ms to
    build, issue 42.)"""

    def __init__(self, serial: int, get: Getter, scan: Scanner) -> None:
        self.serial = serial  # the last commit this transaction can see
        self._get = get
        self._scan = scan
        self.reads: set[bytes] = set()
        self.prefixes: set[bytes] = set()
        self.writes: dict[bytes, bytes | None] = {}  # None deletes
        self.preconditions: list[tuple[bytes, object]] = []

    def get(self, key: bytes) -> bytes | None:
        if key in self.writes:
            return self.writes[key]
        self.reads.add(key)
        return self._get(key)

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Every key with the prefix, in order, this transaction's own writes included."""
        self.prefixes.add(prefix)
        return overlay(self._scan(prefix), self.writes.items(), prefix)

    def put(self, key: bytes, value: bytes) -> None:
        self.writes[key] = value

    def delete(self, key: bytes) -> None:
        self.writes[key] = None

    def require_exists(self, key: bytes) -> None:
        self.preconditions.append((key, _EXISTS))

    def require_absent(self, key: bytes) -> None:
        self.preconditions.append((key, _ABSENT))

    def require_value(self, key: bytes, value: bytes) -> None:
        self.preconditions.append((key, value))


def overlay(
    stored: Iterable[tuple[bytes, bytes]], writes: Iterable[tuple[bytes, bytes | None]],
    prefix: bytes,
) -> list[tuple[bytes, bytes]]:
    """The keys under `prefix` after applying `writes` (None deletes) over `stored`, sorted."""
    found = dict(stored)
    for key, value in writes:
        if key.startswith(prefix):
            if value is None:
                found.pop(key, None)
            else:
                found[key] = value
    return sorted(found.items())


def check_preconditions(tx: Transaction, get: Getter) -> None:
    for key, expected in tx.preconditions:
        actual = get(key)
        if expected is _EXISTS:
            ok = actual is not None
        elif expected is _ABSENT:
            ok = actual is None
        else:
            ok = actual == expected
        if not ok:
            raise PreconditionFailed(f"precondition on {key!r} does not hold")


def conflicts(tx: Transaction, written: frozenset[bytes]) -> bool:
    """Whether a commit that wrote `written` invalidates what `tx` read."""
    if not tx.reads.isdisjoint(written):
        return True
    return any(key.startswith(prefix) for prefix in tx.prefixes for key in written)
