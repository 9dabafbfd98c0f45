"""The network fuzzer (fuzz/network.py) against a real broker process: a short seeded run
in `make test` (`make fuzz` runs 1,000,000 packets), one with enhanced authentication on (its
AUTH packets then reach the SCRAM exchange, not only the refusals), and proof that it fails
when it should: a handler that raises now and then, a broker that dies."""

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fuzz.network import run
from fuzz.streams import SCRAM_USERS
from tests.support.broker_process import BrokerProcess

SEED = 20261124
CRASHING_HANDLER = Path(__file__).parent / "crash_injection"

StartBroker = Callable[..., BrokerProcess]


def test_short_run_finds_nothing(start_broker: StartBroker) -> None:
    broker = start_broker()
    report = run(broker, SEED, 20_000, connections=16, warmup=2_000)
    assert report.findings == [], report.render()
    assert report.packets >= 20_000
    assert report.closes["MALFORMED_PACKET"] and report.closes["PROTOCOL_ERROR"]
    assert all(stats.received for stats in report.good)
    assert report.exit_code == 0
    # Enhanced authentication is off: AUTH packets were refused, not ignored.
    assert _logged(broker, "AUTH without an authentication method in CONNECT")


def test_auth_packets_with_enhanced_authentication_on(start_broker: StartBroker,
                                                      tmp_path: Path) -> None:
    """The same fuzzing against a broker that offers SCRAM: CONNECTs naming it start real
    exchanges (for a user that exists and ones that do not), so the AUTH packets that follow
    reach the SCRAM state machine instead of being refused at the door."""
    users = tmp_path / "scram.json"
    subprocess.run([sys.executable, "-m", "broker", "ctl", "users", "add", SCRAM_USERS[0],
                    "--scram", "--file", str(users), "--password", "fz"], check=True)
    broker = start_broker(**{"authentication.scram.user_file": str(users)})
    report = run(broker, SEED + 1, 10_000, connections=16, warmup=1_000)
    assert report.findings == [], report.render()
    assert all(stats.received for stats in report.good)
    assert report.exit_code == 0
    assert _logged(broker, "SCRAM-SHA-256 of "), "no SCRAM exchange reached its end"
    assert _logged(broker, "SCRAM-SHA-512 of ")
    assert _logged(broker, "AUTH with method"), "no AUTH naming another method"


def _logged(broker: BrokerProcess, text: str) -> bool:
    return any(text in line for line in broker.log_lines)


def test_a_handler_that_raises_is_a_finding(
    start_broker: StartBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(CRASHING_HANDLER))  # its sitecustomize.py
    report = run(start_broker(), SEED, 3_000, connections=8, warmup=0)
    assert any(f.startswith("Traceback in the broker log") and "injected handler bug" in f
               for f in report.findings), report.render()
    assert any("ERROR in the broker log: broker.server.connection: internal error" in f
               for f in report.findings)


def test_a_broker_that_dies_is_a_finding(start_broker: StartBroker) -> None:
    broker = start_broker()

    def kill_at_1000(sent: int) -> None:
        if sent >= 1_000:
            broker.kill()

    report = run(broker, SEED, 20_000, connections=8, warmup=0, progress=kill_at_1000)
    assert report.findings[0] == "broker process exited (code -9)", report.render()
    assert report.packets < 20_000
