"""Requests too big for one event-loop turn: a SUBSCRIBE or UNSUBSCRIBE of tens of thousands
of filters. The handler is a generator that yields after each step; it runs in time slices
(`run_in_slices`), other connections are served in between, and the client's later packets
wait for it (`Connection.hold_input`), so they are still handled in the order they came."""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from broker.session.durable.turn import run_in_slices

if TYPE_CHECKING:
    from broker.server.connection import Connection


def handle_in_slices(conn: "Connection", steps: Iterator[None]) -> None:
    rest = run_in_slices(_while_open(conn, steps))
    if rest is not None:
        conn.hold_input(rest)


async def finish_in_slices(conn: "Connection", steps: Iterator[None]) -> None:
    """`handle_in_slices` for a handler already running in a task that holds the input."""
    rest = run_in_slices(_while_open(conn, steps))
    if rest is not None:
        await rest


def _while_open(conn: "Connection", steps: Iterator[None]) -> Iterator[None]:
    """Stops once the connection is closed: what was done stays, as if the client had left
    right after its request."""
    for _ in steps:
        yield
        if conn.closed:
            return
