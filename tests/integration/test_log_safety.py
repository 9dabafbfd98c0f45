"""What a client sends cannot forge a line of the broker's log, nor flood it: the log is read
from a real broker's stderr after a client with a hostile client ID was closed for a
protocol error (the broker logs the client ID and the error's text)."""

from collections.abc import Callable

import pytest

from broker.mqtt.packets import Publish
from tests.integration.clients import unique, wait_until
from tests.protocol.rawclient import RawClient
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

FORGED = "2000-01-01 00:00:00,000 INFO broker.server.connection: "


def closed_for_a_wildcard_topic(broker: BrokerProcess, client_id: str, marker: str) -> list[str]:
    """Connects as `client_id`, publishes to a topic name with a wildcard (the broker closes
    the connection and logs why), and returns the log lines that mention `marker`."""
    client = RawClient(broker.tcp)
    try:
        client.connect(client_id)
        client.send(Publish(f"bad/{marker}/#", b""))
        assert client.closed_by_broker()
    finally:
        client.close()
    wait_until(lambda: any("closing" in line and marker in line for line in broker.log_lines),
               what="the log line about the closed client")
    return [line for line in broker.log_lines if marker in line]


def test_a_newline_in_a_client_id_does_not_forge_a_log_line(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    broker = start_broker()
    marker = unique("inject")
    client_id = f"{marker}\n{FORGED}forged by {marker}\r\x1b[2J"
    lines = closed_for_a_wildcard_topic(broker, client_id, marker)
    assert len(lines) == 1, lines
    assert f"{marker}\\n{FORGED}forged by {marker}\\r\\x1b[2J" in lines[0]
    assert not any(line.startswith(FORGED) for line in broker.log_lines)


def test_a_60_kb_client_id_is_logged_clipped(start_broker: Callable[..., BrokerProcess]) -> None:
    broker = start_broker()
    marker = unique("long")
    client_id = marker + "A" * (60_000 - len(marker))
    (line,) = closed_for_a_wildcard_topic(broker, client_id, marker)
    assert "…(60000 chars)" in line
    assert len(line) < 1000, f"{len(line)} characters logged"
