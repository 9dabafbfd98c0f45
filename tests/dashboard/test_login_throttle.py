"""Repeated wrong dashboard passwords from one address lock that address out for a while
(429 with Retry-After), against a real broker; and the throttle's counting on its own."""

import http.client
import json
import time
from collections.abc import Callable

import pytest

from broker.http.dashboard.throttle import LoginThrottle
from tests.integration.clients import wait_until
from tests.support.broker_process import BrokerProcess


def _login(port: int, password: str, source: str = "127.0.0.1"
           ) -> tuple[int, dict[str, object], str | None]:
    """(status, body, Retry-After) of one login sent from `source` (any 127/8 address is
    this machine's, so a second client address needs no second machine)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                            source_address=(source, 0))
    try:
        connection.request("POST", "/api/v5/login",
                           json.dumps({"username": "admin", "password": password}),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read()), response.getheader("Retry-After")
    finally:
        connection.close()


@pytest.mark.integration
def test_repeated_wrong_passwords_lock_the_address_out(
        dashboard_broker: Callable[..., BrokerProcess]) -> None:
    broker = dashboard_broker(**{"dashboard.unsuccessful_login_max_attempts": "3",
                                 "dashboard.unsuccessful_login_lock_duration": "2s"})
    port = broker.ports["http"]
    assert [_login(port, "wrong")[0] for _ in range(3)] == [401, 401, 401]
    status, body, retry_after = _login(port, "public")  # right, and still refused
    assert status == 429 and body["code"] == "LOGIN_LOCKED"
    assert retry_after in ("1", "2") and f"try again in {retry_after} s" in str(body["message"])
    locked_at = time.monotonic()
    assert _login(port, "public", source="127.0.0.2")[0] == 200  # another address: not locked
    assert broker.metric("mqtt_dashboard_logins_total", result="locked") == 1
    wait_until(lambda: _login(port, "public")[0] == 200, timeout=10,
               what="the lock to end")
    assert time.monotonic() - locked_at >= 1.0
    # The lock's end starts a new count: a success cleared it, so one miss does not lock.
    assert _login(port, "wrong")[0] == 401
    assert _login(port, "public")[0] == 200


def test_failures_count_within_the_interval_only() -> None:
    throttle = LoginThrottle(max_attempts=3, interval=60, lock_duration=600)
    throttle.failed("a", 0)
    throttle.failed("a", 30)
    throttle.failed("a", 61)  # the first is out of the window: two within it
    assert throttle.locked_for("a", 61) is None
    throttle.failed("a", 62)
    assert throttle.locked_for("a", 62) == 600
    assert throttle.locked_for("b", 62) is None
    assert throttle.locked_for("a", 662) is None


def test_a_success_clears_the_count_and_memory_stays_bounded() -> None:
    throttle = LoginThrottle(max_attempts=2, interval=60, lock_duration=10, max_addresses=2)
    throttle.failed("a", 0)
    throttle.succeeded("a")
    throttle.failed("a", 1)
    assert throttle.locked_for("a", 1) is None
    throttle.failed("a", 2)
    assert throttle.locked_for("a", 2) == 10
    throttle.failed("b", 3)
    throttle.failed("c", 3)  # a third address: the oldest entry ("a") is forgotten
    assert throttle.locked_for("a", 3) is None
