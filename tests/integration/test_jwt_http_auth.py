"""JWT and HTTP authentication on a live broker, with paho clients: signatures, expiry
(refused, and a live connection ended), an `acl` claim enforced, a JWKS file rotated; an
aiohttp service answering allow, deny, ignore, 500, one too slow to answer, and one slow
under a storm of 1,000 CONNECTs while another client's round trips stay fast."""

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec

from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import MQTT_5
from broker.mqtt.packets import Connack, Connect, Pingreq, Pingresp
from tests.integration.clients import PahoClient, unique, wait_until
from tests.support.broker_process import BrokerProcess
from tests.support.http_service import ThreadedService, assert_bounded_storm
from tests.support.round_trip_probe import RoundTripProbe

SECRET = "s3cret-" * 10  # 70 bytes: long enough for HS512 too
SLOW_SERVICE_S = 2.0  # how long the service takes for a "sleepy-*" user


def _connect(clients: list[PahoClient], port: int, user: str | None, password: str | None,
             client_id: str | None = None) -> PahoClient:
    client = PahoClient(port, client_id or unique("tok"), version=5)
    if user is not None:
        client.client.username_pw_set(user, password)
    clients.append(client)
    client.connect(expect_success=False)
    return client


def _code(client: PahoClient) -> int:
    assert client.connack is not None
    return client.connack.reason_code


def _token(claims: dict[str, Any], key: Any = SECRET, algorithm: str = "HS256",
           kid: str | None = None) -> str:
    return jwt.encode(claims, key, algorithm, headers={"kid": kid} if kid else None)


def test_jwt_signature_expiry_and_acl_claim(start_broker: Callable[..., BrokerProcess],
                                            clients: list[PahoClient]) -> None:
    broker = start_broker(**{"authentication.jwt.secret": SECRET,
                             "authentication.jwt.leeway": "0s"})
    port, now = broker.tcp, int(time.time())
    acl = [{"permission": "allow", "action": "publish", "topic": "own/${clientid}/#"},
           {"permission": "deny", "action": "all", "topic": "#"}]
    good = _connect(clients, port, "u", _token({"exp": now + 60, "acl": acl}), "dev1")
    assert _code(good) == 0
    assert good.publish("own/dev1/x", b"1", qos=1) in (0, 0x10)
    assert good.publish("other/x", b"1", qos=1) == 0x87
    assert _code(_connect(clients, port, "u", _token({"exp": now + 60}, "x" * 64))) == 0x86
    assert _code(_connect(clients, port, "u", _token({"exp": now - 5}))) == 0x86
    assert _code(_connect(clients, port, "u", _token({"exp": now + 60}, algorithm="HS512"))) == 0
    assert _code(_connect(clients, port, "u", "not a token")) == 0x86
    assert _code(_connect(clients, port, None, None)) == 0x87  # JWT on: no anonymous
    short = _connect(clients, port, "u", _token({"exp": now + 2}))
    assert _code(short) == 0
    assert short.wait_disconnected(timeout=10) == 0xA0  # Maximum connect time
    assert broker.metric("mqtt_auth_failures_total", reason="jwt_bad_signature") == 1
    assert broker.metric("mqtt_auth_failures_total", reason="jwt_expired") == 1


def _jwks(key: ec.EllipticCurvePrivateKey, kid: str) -> str:
    public = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    return json.dumps({"keys": [{**public, "kid": kid, "alg": "ES256", "use": "sig"}]})


def test_es256_from_a_jwks_file_that_is_rotated(start_broker: Callable[..., BrokerProcess],
                                                clients: list[PahoClient],
                                                tmp_path: Path) -> None:
    old, new = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    jwks = tmp_path / "jwks.json"
    jwks.write_text(_jwks(old, "k1"))
    broker = start_broker(**{"authentication.jwt.jwks_file": str(jwks)})
    port, exp = broker.tcp, int(time.time()) + 60
    assert _code(_connect(clients, port, "u", _token({"exp": exp}, old, "ES256", "k1"))) == 0
    assert _code(_connect(clients, port, "u", _token({"exp": exp}, new, "ES256", "k2"))) == 0x86
    # An HS256 token whose "secret" is the public key must not pass (alg confusion).
    assert _code(_connect(clients, port, "u", _token({"exp": exp}, SECRET, "HS256", "k1"))) \
        == 0x86
    jwks.write_text(_jwks(new, "k2"))
    wait_until(lambda: broker.metric("mqtt_security_reloads_total", result="ok") >= 1, 10,
               "JWKS reloaded")
    assert _code(_connect(clients, port, "u", _token({"exp": exp}, new, "ES256", "k2"))) == 0
    assert _code(_connect(clients, port, "u", _token({"exp": exp}, old, "ES256", "k1"))) == 0x86


class JwksService(ThreadedService):
    """A JWKS at /jwks whose document the test replaces; `broken` answers 500."""

    def __init__(self, document: str) -> None:
        self.document, self.broken, self.fetches = document, False, 0
        super().__init__("/jwks", self._jwks, method="GET")

    async def _jwks(self, request: web.Request) -> web.Response:
        self.fetches += 1
        if self.broken:
            return web.Response(status=500)
        return web.Response(text=self.document, content_type="application/json")


def test_es256_from_a_jwks_endpoint_refreshed(start_broker: Callable[..., BrokerProcess],
                                              clients: list[PahoClient]) -> None:
    """EMQX's `endpoint` and `refresh_interval`: keys rotated at the provider are used after
    the next fetch; a fetch that fails keeps the keys in force."""
    old, new = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    service = JwksService(_jwks(old, "k1"))
    try:
        broker = start_broker(**{
            "authentication.jwt.endpoint": f"http://127.0.0.1:{service.port}/jwks",
            "authentication.jwt.refresh_interval": "1s"})
        port, exp = broker.tcp, int(time.time()) + 60
        wait_until(lambda: broker.metric("mqtt_security_reloads_total", result="ok") >= 1,
                   10, "the first fetch")
        assert _code(_connect(clients, port, "u", _token({"exp": exp}, old, "ES256", "k1"))) \
            == 0
        assert _code(_connect(clients, port, "u", _token({"exp": exp}, new, "ES256", "k2"))) \
            == 0x86
        service.broken = True
        wait_until(lambda: broker.metric("mqtt_security_reloads_total", result="failed") >= 1,
                   10, "a failed fetch")
        assert _code(_connect(clients, port, "u", _token({"exp": exp}, old, "ES256", "k1"))) \
            == 0  # kept
        service.document, service.broken = _jwks(new, "k2"), False
        wait_until(lambda: _code(_connect(clients, port, "u", _token(
            {"exp": exp}, new, "ES256", "k2"))) == 0, 10, "the rotated key in force")
        assert _code(_connect(clients, port, "u", _token({"exp": exp}, old, "ES256", "k1"))) \
            == 0x86
    finally:
        service.stop()


class AuthService(ThreadedService):
    """An HTTP authentication service: answers by user name."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        super().__init__("/auth", self._auth)

    async def _auth(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        user = body["username"]
        if user == "slow":
            await self.held(30)
        if user.startswith("sleepy"):  # slow but alive: every request answered, late
            await asyncio.sleep(SLOW_SERVICE_S)
            return web.json_response({"result": "allow"})
        if user == "broken":
            return web.Response(status=500)
        result = {"good": "allow", "root": "allow", "bad": "deny"}.get(user, "ignore")
        return web.json_response({"result": result, "is_superuser": user == "root"})


@pytest.fixture
def service() -> Iterator[AuthService]:
    running = AuthService()
    yield running
    running.stop()


def test_http_allow_deny_ignore_errors_and_a_slow_service(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient],
        service: AuthService, tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic read nothing/#\n")
    broker = start_broker(**{
        "authentication.http.url": f"http://127.0.0.1:{service.port}/auth",
        "authentication.http.body": '{"username": "${username}", "password": "${password}",'
                                    ' "clientid": "${clientid}"}',
        "authentication.http.request_timeout": "1s",
        "authentication.http.max_inflight": "4",
        "authorization.acl_file": str(acl)})
    port = broker.tcp
    good = _connect(clients, port, "good", "pw", "c-good")
    assert _code(good) == 0
    assert {"username": "good", "password": "pw", "clientid": "c-good"} in service.requests
    assert good.publish("t/x", b"1", qos=1) == 0x87  # the ACL file applies to it
    root = _connect(clients, port, "root", "pw")
    assert _code(root) == 0 and root.publish("t/x", b"1", qos=1) in (0, 0x10)  # superuser
    assert _code(_connect(clients, port, "bad", "pw")) == 0x86
    assert _code(_connect(clients, port, "nobody", "pw")) == 0x86  # ignore, chain ends
    assert _code(_connect(clients, port, "broken", "pw")) == 0x88
    # A service that does not answer: refused after request_timeout, and past max_inflight
    # refused at once, while other clients connect meanwhile.
    slow = [PahoClient(port, unique("slow"), version=5) for _ in range(6)]
    clients.extend(slow)
    for client in slow:
        client.client.username_pw_set("slow", "pw")
        client.client.connect_async("127.0.0.1", port)
        client.client.loop_start()
    wait_until(lambda: broker.metric("mqtt_auth_failures_total",
                                     reason="http_unavailable") >= 2, 10, "past max_inflight")
    assert _code(_connect(clients, port, "good", "pw")) in (0, 0x88)
    wait_until(lambda: all(c.connack is not None for c in slow), 10, "slow ones answered")
    assert {_code(c) for c in slow} == {0x88}


STORM = 1_000  # clients connecting at once
STORM_INFLIGHT = 8  # authentication.http.max_inflight
PROBE_BOUND_S = 1.0  # a responsive broker's round trip, however loaded the machine is


async def _stormer(port: int, number: int) -> tuple[int, float]:
    """One of the storm, with a raw v5 CONNECT (a thousand paho clients would cost a
    thousand threads): its CONNACK's reason code and how long it took to come."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(f"storm-{number}", MQTT_5, True, 60, f"sleepy-{number}", b"pw"),
                        MQTT_5))
    decoder = Decoder(version=MQTT_5)
    while not (packets := decoder.feed(await reader.read(4096))):
        if reader.at_eof():
            raise EOFError("the broker closed the connection without answering")
    writer.close()
    assert len(packets) == 1 and isinstance(packets[0], Connack), packets
    return packets[0].reason_code, time.monotonic() - started


async def _storm(port: int) -> list[tuple[int, float]]:
    return await asyncio.gather(*(_stormer(port, number) for number in range(STORM)))


def test_a_slow_service_under_1000_connecting_clients(
        start_broker: Callable[..., BrokerProcess], service: AuthService) -> None:
    """A slow service holds at most max_inflight CONNECTs; the rest are refused at once with
    0x88 and counted, and a client that does not need the service sees the broker as
    responsive as ever. Unbounded, all 1,000 would wait SLOW_SERVICE_S and pass."""
    broker = start_broker(**{
        "authentication.http.url": f"http://127.0.0.1:{service.port}/auth",
        "authentication.http.max_inflight": str(STORM_INFLIGHT),
        "authentication.http.pool_size": str(STORM_INFLIGHT),
        "authentication.http.request_timeout": f"{SLOW_SERVICE_S * 5}s",
        "authentication.jwt.secret": SECRET})
    # A JWT client's CONNECT never asks the HTTP service: it pings before and throughout
    # the storm.
    token = _token({"exp": int(time.time()) + 600}).encode()
    probe = RoundTripProbe(broker.tcp, unique("probe"), lambda _: Pingreq(),
                           lambda answer: isinstance(answer, Pingresp), "probe", token)
    try:
        answers = asyncio.run(asyncio.wait_for(_storm(broker.tcp), 120))
    finally:
        slowest_probe, pings = probe.stop()
    refused = assert_bounded_storm(answers, 0, 0x88, STORM_INFLIGHT, SLOW_SERVICE_S)
    assert broker.metric("mqtt_auth_failures_total", reason="http_unavailable") == refused
    assert pings >= 3 and slowest_probe < PROBE_BOUND_S, (pings, slowest_probe)
