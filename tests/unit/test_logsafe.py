"""Log records render on one line, client-controlled parts escaped and clipped, while the
broker's own tracebacks keep their layout."""

import io
import logging
from collections.abc import Iterator

import pytest

from broker import logsafe
from broker.mqtt.errors import ProtocolError

FORMAT = "%(levelname)s %(message)s"


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logsafe.handler(FORMAT)
    handler.setStream(stream)  # type: ignore[attr-defined]
    logger = logging.getLogger("test.logsafe")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


@pytest.mark.parametrize(("raw", "shown"), [
    ("plain id-1/é/中", "plain id-1/é/中"),
    ("a\nb\rc\td", "a\\nb\\rc\\td"),
    ("\x00\x1b[31m\x7f\x85", "\\x00\\x1b[31m\\x7f\\x85"),
    ("line\u2028sep\u2029\u202eevil\u2066", "line\\u2028sep\\u2029\\u202eevil\\u2066"),
])
def test_control_characters_are_escaped(raw: str, shown: str) -> None:
    assert logsafe.clean(raw) == shown


def test_long_values_are_clipped_with_their_length() -> None:
    assert logsafe.clean("x" * 128) == "x" * 128
    assert logsafe.clean("x" * 60_000) == "x" * 128 + "…(60000 chars)"
    assert logsafe.clean("\n" * 200, 4) == "\\n" * 4 + "…(200 chars)"


def test_arguments_of_every_kind(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = logged
    evil = "id\nINFO forged"
    logger.info("s=%s r=%r d=%d f=%.1f n=%s", evil, evil, 7, 2.5, None)
    logger.info("%(who)s left", {"who": evil})
    logger.info("closing %s: %s", "c" * 500, ProtocolError(f"bad topic {evil}"))
    assert stream.getvalue().splitlines() == [
        "INFO s=id\\nINFO forged r='id\\nINFO forged' d=7 f=2.5 n=None",
        "INFO id\\nINFO forged left",
        f"INFO closing {'c' * 128}…(500 chars): bad topic id\\nINFO forged",
    ]


def test_a_second_handler_shows_the_same(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, first = logged
    second = io.StringIO()
    handler = logsafe.handler(FORMAT)
    handler.setStream(second)  # type: ignore[attr-defined]
    logger.addHandler(handler)
    try:
        logger.info("%s", "y" * 300)
    finally:
        logger.removeHandler(handler)
    assert first.getvalue() == second.getvalue() == f"INFO {'y' * 128}…(300 chars)\n"


def test_a_message_built_outside_the_arguments_stays_on_one_line(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    client_id = "a\nINFO forged"
    logger.info("formatted by the caller: " + client_id)
    assert stream.getvalue() == "INFO formatted by the caller: a\\nINFO forged\n"


def test_tracebacks_keep_their_lines_and_escape_exception_messages(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = logged
    try:
        try:
            raise ValueError("inner\nINFO forged")
        except ValueError as error:
            raise ProtocolError("outer " + "z" * 5000) from error
    except ProtocolError:
        logger.exception("failed")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "ERROR failed"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[2].startswith('  File "') and lines[3].strip() == (
        'raise ValueError("inner\\nINFO forged")')
    assert "ValueError: inner\\nINFO forged" in lines
    assert "The above exception was the direct cause of the following exception:" in lines
    last = f"broker.mqtt.errors.ProtocolError: outer {'z' * 5000}"
    assert lines[-1] == f"{last[:logsafe.MAX_MESSAGE]}…({len(last)} chars)"
    assert not any(line.startswith("INFO") for line in lines)
