"""The dashboard's login and the endpoints it uses, over HTTP against a real broker: tokens
pass the same role check as API keys, and bad input gets a clear, uninformative refusal."""

import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from broker.config.loader import load_config
from broker.http.auth import ApiKeys
from broker.http.dashboard import add_dashboard_routes
from broker.http.dashboard.login import Logins, PasswordFileError
from tests.dashboard.conftest import ADMIN_KEY, VIEWER_KEY, call, login, paho
from tests.integration.clients import PahoClient, wait_until
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

Start = Callable[..., BrokerProcess]
Admin = tuple[BrokerProcess, int, str]


@pytest.fixture
def admin(dashboard_broker: Start) -> Admin:
    """A broker, its HTTP port and an administrator's dashboard token."""
    broker = dashboard_broker()
    return broker, broker.ports["http"], login(broker.ports["http"])


def test_wrong_user_or_password_get_the_same_401(dashboard_broker: Start) -> None:
    broker = dashboard_broker()
    port = broker.ports["http"]
    wrong_password = call(port, "/api/v5/login", "POST",
                          body={"username": "admin", "password": "nope"})
    wrong_user = call(port, "/api/v5/login", "POST",
                      body={"username": "root", "password": "public"})
    assert wrong_password == wrong_user == (
        401, {"code": "BAD_USERNAME_OR_PWD", "message": "Auth failed"})
    assert call(port, "/api/v5/login", "POST", body={"username": 1})[0] == 400
    assert broker.metric("mqtt_dashboard_logins_total", result="rejected") == 2
    login(port)
    assert broker.metric("mqtt_dashboard_logins_total", result="ok") == 1


def test_data_endpoints_need_a_live_token(dashboard_broker: Start) -> None:
    port = dashboard_broker().ports["http"]
    paths = ["/api/v5/clients", "/api/v5/durable_sessions", "/api/v5/monitor_current",
             "/api/v5/mqtt/retainer/messages", "/api/v5/ds/storages", "/api/v5/me",
             "/api/v5/clients/x/subscriptions", "/api/v5/listeners"]
    for path in paths:
        assert call(port, path)[0] == 401, path
        assert call(port, path, token="made-up")[0] == 401, path
    token = login(port)
    for path in paths:
        assert call(port, path, token=token)[0] in (200, 404), path
    assert call(port, "/api/v5/logout", "POST", token=token)[0] == 204
    assert call(port, "/api/v5/clients", token=token) == (
        401, {"code": "TOKEN_TIME_OUT", "message": "the dashboard login expired or was"
              " logged out"})
    assert call(port, "/api/v5/logout", "POST", token=token)[0] == 401


def test_a_token_expires(dashboard_broker: Start) -> None:
    port = dashboard_broker(**{"dashboard.token_expired_time": "1s"}).ports["http"]
    token = login(port)
    assert call(port, "/api/v5/clients", token=token)[0] == 200
    wait_until(lambda: call(port, "/api/v5/clients", token=token)[0] == 401, timeout=5,
               what="the token to expire")


def test_the_page_and_its_assets_are_served_by_the_broker_with_a_strict_policy(
        dashboard_broker: Start) -> None:
    """No CDN: nothing on the page names another origin; scripts from this one only."""
    port = dashboard_broker().ports["http"]
    for path in ("/", "/dashboard/app.js", "/dashboard/mqtt.js", "/dashboard/chart.js",
                 "/dashboard/app.css"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            text = response.read().decode()
            policy = response.headers["Content-Security-Policy"]
        assert "http://" not in text and "https://" not in text, path
        assert "script-src" not in policy and "default-src 'self'" in policy
    assert call(port, "/dashboard/../api_key")[0] == 404


def test_a_viewer_key_logs_in_read_only(dashboard_broker: Start,
                                        clients: list[PahoClient]) -> None:
    broker = dashboard_broker()
    port = broker.ports["http"]
    client = paho(clients, broker)
    token = login(port, *VIEWER_KEY)
    assert call(port, "/api/v5/me", token=token) == (200, {"role": "viewer"})
    assert call(port, "/api/v5/clients", token=token)[0] == 200
    assert call(port, f"/api/v5/clients/{client.client_id}", "DELETE", token=token)[0] == 403
    assert client.connected
    admin = login(port, *ADMIN_KEY)
    assert call(port, "/api/v5/me", token=admin) == (200, {"role": "administrator"})


def test_kick_ends_the_session_and_a_gone_client_gets_a_clear_404(
        admin: Admin, clients: list[PahoClient]) -> None:
    broker, port, token = admin
    client = paho(clients, broker, session_expiry=3600)
    client.subscribe("k/#", 1)
    status, subscriptions = call(port, f"/api/v5/clients/{client.client_id}/subscriptions",
                                 token=token)
    assert status == 200 and [s["topic"] for s in subscriptions] == ["k/#"]
    assert call(port, f"/api/v5/clients/{client.client_id}", "DELETE", token=token)[0] == 204
    assert client.wait_disconnected() == 0x98
    status, body = call(port, f"/api/v5/clients/{client.client_id}", "DELETE", token=token)
    assert status == 404 and "already gone" in body["message"]
    assert call(port, f"/api/v5/clients/{client.client_id}", token=token)[0] == 404


def test_durable_sessions_count_what_an_offline_one_missed(
        admin: Admin, clients: list[PahoClient]) -> None:
    broker, port, token = admin
    away = paho(clients, broker, session_expiry=120)
    away.subscribe("m/+", 1)
    away.subscribe("m/a", 1)  # overlapping: a message on m/a is due twice
    away.disconnect()
    publisher = paho(clients, broker)
    for topic in ("m/a", "m/b", "other"):
        publisher.publish(topic, b"x", qos=1)
    status, body = call(port, "/api/v5/durable_sessions?connected=false", token=token)
    assert status == 200
    (view,) = [v for v in body["data"] if v["clientid"] == away.client_id]
    assert view["missed_cnt"] == 3 and not view["missed_capped"]
    assert 0 < view["expires_at"] - view["now"] <= 120


def test_retained_messages_get_and_delete(admin: Admin, clients: list[PahoClient]) -> None:
    broker, port, token = admin
    publisher = paho(clients, broker)
    publisher.publish("r/a b/c", b"\x00\xff", qos=1, retain=True)
    status, body = call(port, "/api/v5/mqtt/retainer/messages?topic=r/%23", token=token)
    assert status == 200 and [m["topic"] for m in body["data"]] == ["r/a b/c"]
    status, message = call(port, "/api/v5/mqtt/retainer/message/r%2Fa%20b%2Fc", token=token)
    assert status == 200 and message["payload"] == "AP8="
    assert call(port, "/api/v5/mqtt/retainer/message/r/%2B", token=token)[0] == 404
    assert call(port, "/api/v5/mqtt/retainer/message/r%2Fa%20b%2Fc", "DELETE",
                token=token)[0] == 204
    assert call(port, "/api/v5/mqtt/retainer/message/r%2Fa%20b%2Fc", token=token)[0] == 404


def test_default_password_is_refused_off_loopback() -> None:
    """Decided from the bind, not from where a request comes from: behind a proxy every
    request looks local."""
    for bind, refused in (("0.0.0.0:18083", True), ("127.0.0.1:18083", False),
                          ("[::1]:18083", False), ("10.0.0.5:18083", True)):
        logins = Logins(load_config(None, [f"dashboard.listeners.http.bind={bind}"]))
        assert logins.password_refused is refused, bind
    other = Logins(load_config(None, ["dashboard.listeners.http.bind=0.0.0.0:18083",
                                      "dashboard.default_password=s3cret-enough"]))
    assert not other.password_refused
    assert other.user_role("admin", "s3cret-enough") == "administrator"
    assert other.user_role("admin", "public") is None


def test_a_password_file_replaces_the_password(tmp_path: Path, dashboard_broker: Start) -> None:
    secret = tmp_path / "password"
    secret.write_text("from-a-secret\n")
    port = dashboard_broker(**{"dashboard.default_password_file": str(secret)}).ports["http"]
    assert call(port, "/api/v5/login", "POST",
                body={"username": "admin", "password": "public"})[0] == 401
    assert login(port, "admin", "from-a-secret")
    secret.write_text("")
    with pytest.raises(PasswordFileError, match="empty"):
        Logins(load_config(None, [f"dashboard.default_password_file={secret}"]))


async def test_login_off_loopback_with_the_default_password_says_what_to_do(
        tmp_path: Path) -> None:
    """An API key still logs in; the user name never does, whatever password is sent, until
    the password is changed. (In-process: a broker bound to 0.0.0.0 would listen beyond
    this machine.)"""
    keys = tmp_path / "keys"
    keys.write_text(":".join(ADMIN_KEY) + "\n")
    logins = Logins(load_config(None, ["dashboard.listeners.http.bind=0.0.0.0:18083"]))
    logins.keys = ApiKeys(keys)
    app = web.Application()
    add_dashboard_routes(app, logins)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        for password in ("public", "wrong"):
            response = await client.post("/api/v5/login",
                                         json={"username": "admin", "password": password})
            assert response.status == 403
            assert "dashboard.default_password" in (await response.json())["message"]
        response = await client.post("/api/v5/login", json=dict(zip(
            ("username", "password"), ADMIN_KEY, strict=True)))
        assert response.status == 200 and (await response.json())["role"] == "administrator"
