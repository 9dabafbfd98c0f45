"""Log lines a client cannot forge or flood.

Client IDs, user names, topics and other peer-supplied strings reach log messages as
arguments and inside exception texts. A newline in one of them would write a line that
looks like the broker's own, and a 60 KB client ID would be repeated whole on every line
about that client. The handler `handler()` builds (installed by the CLI) applies two rules
in one place, whatever the call site:

- every argument of a record is rendered escaped (control characters, Unicode line and
  paragraph separators and bidirectional overrides as `\\n`, `\\x1b`, `\\u2028`, ...) and
  clipped to `MAX_VALUE` characters, followed by `…(N chars)` with its original length;
- the rendered message and the message of each exception in a traceback are escaped the
  same way and clipped to `MAX_MESSAGE`; the traceback's own lines (frames and source, the
  broker's code) keep their layout, so `log.exception` still reads as a traceback.

Numbers and None are passed through as they are: `%d` needs them and no client controls
their rendering.
"""

import logging
import traceback
from collections.abc import Iterator, Mapping
from typing import Any, Final

MAX_VALUE: Final = 128
MAX_MESSAGE: Final = 4096

_BIDI: Final = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
_UNSAFE: Final = (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *_BIDI)
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_of(code: int) -> str:
    char = chr(code)
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_TABLE: Final = {code: _escape_of(code) for code in _UNSAFE}


def clean(text: str, limit: int = MAX_VALUE) -> str:
    """`text` on one line, without characters a terminal or log viewer would interpret, and
    at most `limit` characters of it (before escaping) with the original length after."""
    if len(text) <= limit:
        return text.translate(_TABLE)
    return f"{text[:limit].translate(_TABLE)}…({len(text)} chars)"


class _Clean:
    """An argument as `%s` and `%r` should show it: cleaned. Wrapping instead of converting
    keeps `%r` meaning repr; wrapping twice changes nothing (a second handler is safe)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return clean(str(self.value))

    def __repr__(self) -> str:
        return clean(repr(self.value))


def _wrap(value: object) -> object:
    if value is None or isinstance(value, (int, float, _Clean)):
        return value
    return _Clean(value)


class CleanArguments(logging.Filter):
    """Wraps every argument of a record (a tuple, or the mapping of `%(name)s` formats)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, Mapping):
            record.args = {key: _wrap(value) for key, value in args.items()}
        elif args:
            record.args = tuple(_wrap(value) for value in args)
        return True


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """Every exception a traceback of `exc` shows: causes, contexts, group members."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)


class CleanFormatter(logging.Formatter):
    """Escapes and clips the rendered message and the exception messages in a traceback;
    a message cannot span lines, so every line of the log starts with its own header."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = clean(record.message, MAX_MESSAGE)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        exc = ei[1]
        text = super().formatException(ei)
        if exc is None:
            return text
        for linked in _chain(exc):
            only = "".join(traceback.format_exception_only(linked)).rstrip("\n")
            safe = clean(only, MAX_MESSAGE)
            if only != safe:
                text = text.replace(only, safe)
        return text


def handler(fmt: str) -> logging.Handler:
    """A stderr handler with both rules installed."""
    stream = logging.StreamHandler()
    stream.addFilter(CleanArguments())
    stream.setFormatter(CleanFormatter(fmt))
    return stream
