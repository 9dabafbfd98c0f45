"""Parsers for the value kinds a config key can have (durations, sizes, binds, ...).

Each parser takes the raw value from TOML (already typed) or from `--set` (always a string)
and returns the normalised Python value, or raises ValueError with a message that the
loader prefixes with the key's name.
"""

import re
from collections.abc import Callable
from typing import Any

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SIZE_UNITS = {"": 1, "b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$", re.IGNORECASE)
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmg]?b)?\s*$", re.IGNORECASE)


def parse_duration(raw: Any) -> float:
    """Seconds from `30s`, `2h`, `500ms`, `1d` or a bare number of seconds."""
    if isinstance(raw, bool):
        raise ValueError(f"expected a duration like '30s' or '2h', got {raw!r}")
    if isinstance(raw, int | float):
        if raw < 0:
            raise ValueError(f"duration must not be negative, got {raw!r}")
        return float(raw)
    match = _DURATION_RE.match(str(raw))
    if not match:
        raise ValueError(f"expected a duration like '30s', '2h', '500ms', got {raw!r}")
    number, unit = match.groups()
    return float(number) * _DURATION_UNITS[(unit or "s").lower()]


def parse_size(raw: Any) -> int:
    """Bytes from `1MB`, `64KB`, `512` (binary units, as EMQX reads them)."""
    if isinstance(raw, bool):
        raise ValueError(f"expected a size like '1MB', got {raw!r}")
    if isinstance(raw, int):
        if raw < 0:
            raise ValueError(f"size must not be negative, got {raw!r}")
        return raw
    match = _SIZE_RE.match(str(raw))
    if not match:
        raise ValueError(f"expected a size like '1MB', '64KB' or a number of bytes, got {raw!r}")
    number, unit = match.groups()
    return int(number) * _SIZE_UNITS[(unit or "").lower()]


_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?b)?\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|m|h)\s*$",
                      re.IGNORECASE)

Rate = tuple[float, float]
"""(amount, period in seconds): `10/100ms` is (10.0, 0.1)."""


def parse_rate(*, sizes: bool, zero_unlimited: bool = False, lowest: str | None = None
               ) -> Callable[[Any], Rate | None]:
    """EMQX's rate values: `infinity` (None: no limit) or AMOUNT/PERIOD such as `1000/s`,
    `10/100ms` or `500/10s`; with `sizes`, the amount may carry a size unit (`1MB/s`,
    `64KB/s`, binary units as in `parse_size`); with `zero_unlimited`, `0` is no limit too
    (a throttle turned off, as Mosquitto and RabbitMQ write it); with `lowest` (a rate
    written the same way), slower rates are refused."""

    def parse(raw: Any) -> Rate | None:
        text = str(raw).strip()
        if text.lower() == "infinity" or (zero_unlimited and text == "0"):
            return None
        match = _RATE_RE.match(text)
        if not match or (match.group(2) and not sizes):
            example = "'1MB/s', '64KB/s'" if sizes else "'1000/s', '10/100ms'"
            raise ValueError(f"expected 'infinity' or a rate like {example}, got {raw!r}")
        number, unit, count, period_unit = match.groups()
        amount = float(number) * _SIZE_UNITS[(unit or "").lower()]
        period = float(count or 1) * _DURATION_UNITS[period_unit.lower()]
        if amount <= 0 or period <= 0:
            raise ValueError(f"a rate must be above zero (or 'infinity'), got {raw!r}")
        if floor is not None and amount / period < floor[0] / floor[1]:
            raise ValueError(f"a rate must be at least {lowest}, got {raw!r}")
        return amount, period

    floor = None if lowest is None else parse_rate(sizes=sizes)(lowest)
    return parse


def parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "on", "yes", "1"):
        return True
    if text in ("false", "off", "no", "0"):
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


def parse_int(minimum: int, maximum: int) -> Callable[[Any], int]:
    def parse(raw: Any) -> int:
        if isinstance(raw, bool):
            raise ValueError(f"expected an integer, got {raw!r}")
        try:
            value = int(str(raw).strip()) if not isinstance(raw, int) else raw
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
        if not minimum <= value <= maximum:
            raise ValueError(f"must be between {minimum} and {maximum}, got {value}")
        return value

    return parse


def parse_float(minimum: float) -> Callable[[Any], float]:
    def parse(raw: Any) -> float:
        if isinstance(raw, bool):
            raise ValueError(f"expected a number, got {raw!r}")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, got {raw!r}") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def parse_bind(raw: Any) -> tuple[str, int] | None:
    """`host:port`, `:port` or a bare port; an empty string or `off` disables the listener."""
    text = str(raw).strip()
    if text.lower() in ("", "off", "disabled", "false"):
        return None
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "0.0.0.0", text
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"expected host:port, got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be between 0 and 65535, got {port}")
    return host, port


def parse_str(raw: Any) -> str:
    if not isinstance(raw, str | int | float) or isinstance(raw, bool):
        raise ValueError(f"expected a string, got {raw!r}")
    return str(raw)


def parse_choice(*choices: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        text = str(raw).strip().lower()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
        return text

    return parse


def parse_int_list(minimum: int) -> Callable[[Any], tuple[int, ...]]:
    """A non-empty list of integers, from TOML (`[100, 10]`) or `--set` (`100,10` or `[100,10]`)."""

    def parse(raw: Any) -> tuple[int, ...]:
        items = raw if isinstance(raw, list | tuple) else str(raw).strip().strip("[]").split(",")
        values: list[int] = []
        for item in items:
            if isinstance(item, bool):
                raise ValueError(f"expected a list of integers, got {raw!r}")
            try:
                value = item if isinstance(item, int) else int(str(item).strip())
            except ValueError:
                raise ValueError(f"expected a list of integers, got {raw!r}") from None
            if value < minimum:
                raise ValueError(f"every value must be at least {minimum}, got {value}")
            values.append(value)
        if not values:
            raise ValueError("expected at least one integer")
        return tuple(values)

    return parse


_NODE_NAME_RE = re.compile(r"^[\w.-]+@(\[[0-9a-fA-F:]+\]|[\w.-]+)(?::(\d{1,5}))?$")


def split_node_name(name: str) -> tuple[str, int | None]:
    """(host, port or None) of `NAME@HOST` / `NAME@HOST:PORT` (EMQX's node names, with the
    inter-node port added for nodes that share a host)."""
    match = _NODE_NAME_RE.match(name.strip())
    if not match:
        raise ValueError(f"expected NAME@HOST or NAME@HOST:PORT, got {name!r}")
    host, port = match.group(1).strip("[]"), match.group(2)
    if port is not None and not 0 < int(port) < 65536:
        raise ValueError(f"port must be between 1 and 65535 in {name!r}")
    return host, int(port) if port is not None else None


def _string_items(raw: Any) -> list[str]:
    """A TOML array of strings, or `--set`'s `a,b` / `["a", "b"]`."""
    if isinstance(raw, list | tuple):
        return [str(item).strip() for item in raw]
    text = str(raw).strip().strip("[]")
    return [item.strip().strip("'\"") for item in text.split(",")] if text else []


def parse_node_list(raw: Any) -> tuple[str, ...]:
    """Node names, each `NAME@HOST` or `NAME@HOST:PORT`."""
    items = _string_items(raw)
    for item in items:
        split_node_name(item)
    return tuple(items)


def parse_address_list(raw: Any) -> tuple[tuple[str, int | None], ...]:
    """Addresses, each `HOST` or `HOST:PORT` (IPv6 in brackets)."""
    return tuple(split_node_name(f"x@{item}") for item in _string_items(raw))
