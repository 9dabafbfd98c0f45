"""HTTP authorization (`authorization.http.*`) on a live broker, with an aiohttp service in
the test and paho/gmqtt clients: allow, deny, ignore (the ACL file next, then `no_match`),
500s, timeouts, wills, the TTL cache, and a slow service under many clients, which holds at
most `max_inflight` actions and refuses the rest at once while other clients go on."""

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from broker.mqtt.packets import Puback, Publish
from tests.integration.clients import GmqttClient, PahoClient, unique, wait_until
from tests.support.broker_process import BrokerProcess
from tests.support.http_service import ThreadedService, assert_bounded_storm
from tests.support.round_trip_probe import RoundTripProbe

pytestmark = pytest.mark.integration

SLOW_S = 2.0  # how long the service takes for a `slow/...` topic


class AuthzService(ThreadedService):
    """Answers by the topic's first level: ok allow, no deny, pass ignore, err 500, hang
    never (until released), slow after SLOW_S; records every request's fields."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        super().__init__("/authz", self._authz)

    async def _authz(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        kind = body["topic"].split("/")[0]
        if kind == "err":
            return web.Response(status=500)
        if kind == "hang":
            await self.held(30)
        if kind == "slow":
            await asyncio.sleep(SLOW_S)
        if kind == "ok" and body["action"] == "publish" and body["qos"] == "2":
            return web.Response(status=204)  # 204 is allow too
        result = {"ok": "allow", "slow": "allow", "no": "deny"}.get(kind, "ignore")
        return web.json_response({"result": result})

    def asked(self, action: str, topic: str) -> int:
        return sum(1 for r in self.requests if r["action"] == action and r["topic"] == topic)


@pytest.fixture
def service() -> Iterator[AuthzService]:
    running = AuthzService()
    yield running
    running.stop()


def _client(clients: list[PahoClient], port: int, version: int = 5,
            will: dict[str, Any] | None = None) -> PahoClient:
    client = PahoClient(port, unique("az"), version=version)
    clients.append(client)
    client.connect(will=will, expect_success=False)
    return client


def test_allow_deny_ignore_errors_timeouts_and_wills(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient],
        service: AuthzService, tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite pass/file/#\ntopic deny pass/closed/#\n")
    broker = start_broker(**{
        "authorization.http.url": f"http://127.0.0.1:{service.port}/authz",
        "authorization.http.request_timeout": "1s",
        "authorization.acl_file": str(acl),
        "authorization.no_match": "deny"})
    port = broker.tcp
    client = _client(clients, port)
    assert client.connack is not None and client.connack.reason_code == 0
    # allow (200 and 204) and deny, with the fields EMQX's placeholders give
    assert client.publish("ok/1", b"x", qos=1) in (0, 0x10)
    assert {"clientid": client.client_id, "username": "", "topic": "ok/1",
            "action": "publish", "qos": "1", "retain": "false"} in service.requests
    assert client.publish("ok/2", b"x", qos=2) in (0, 0x10)
    assert client.publish("no/1", b"x", qos=1) == 0x87
    # ignore: the ACL file decides; a topic it has no rule for goes to no_match (deny)
    assert client.publish("pass/file/1", b"x", qos=1) in (0, 0x10)
    assert client.publish("pass/closed/1", b"x", qos=1) == 0x87
    assert client.publish("pass/other/1", b"x", qos=1) == 0x87
    # a service failing or not answering refuses with 0x80, never cached: asked each time
    for _ in range(2):
        assert client.publish("err/1", b"x", qos=1) == 0x80
    assert service.asked("publish", "err/1") == 2
    started = time.monotonic()
    assert client.publish("hang/1", b"x", qos=1) == 0x80
    assert time.monotonic() - started >= 1.0  # request_timeout, not at once
    assert broker.metric("mqtt_authz_unavailable_total", action="publish",
                         reason="failed") == 3
    # SUBSCRIBE: one code per filter, in order; deliveries of an allowed filter arrive
    assert client.subscribe([("ok/#", 1), ("no/#", 1), ("err/#", 1), ("pass/file/#", 0),
                             ("pass/other/#", 0)]) == [1, 0x87, 0x80, 0, 0x87]
    assert {"clientid": client.client_id, "username": "", "topic": "ok/#",
            "action": "subscribe", "qos": "1", "retain": "false"} in service.requests
    sender = _client(clients, port)
    assert sender.publish("ok/deliver", b"hello", qos=1) == 0
    assert client.wait_message_on("ok/deliver").payload == b"hello"
    # 3.1.1: the SUBACK's one failure code; a refused PUBLISH is dropped
    old = _client(clients, port, version=4)
    assert old.subscribe([("no/#", 0), ("err/#", 0), ("ok/old", 0)]) == [0x80, 0x80, 0]
    old.publish("err/old", b"x", qos=1)
    old.publish("ok/old", b"ordered after", qos=1)
    assert [m.topic for m in old.wait_messages(1)] == ["ok/old"]
    # a will is asked about at CONNECT: deny 0x87, service failing 0x88
    for topic, code in (("no/will", 0x87), ("err/will", 0x88), ("ok/will", 0)):
        willing = _client(clients, port, will={"topic": topic, "payload": b"w", "qos": 1})
        assert willing.connack is not None and willing.connack.reason_code == code, topic
    assert broker.metric("mqtt_acl_denied_total", action="write") >= 4


def test_decisions_are_cached_for_their_ttl(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient],
        service: AuthzService) -> None:
    ttl = 2.0
    broker = start_broker(**{
        "authorization.http.url": f"http://127.0.0.1:{service.port}/authz",
        "authorization.cache.ttl": f"{ttl}s"})
    client = _client(clients, broker.tcp)
    first = time.monotonic()
    for _ in range(5):
        assert client.publish("ok/cached", b"x", qos=1) in (0, 0x10)
        assert client.publish("no/cached", b"x", qos=1) == 0x87
    assert service.asked("publish", "ok/cached") == 1
    assert service.asked("publish", "no/cached") == 1
    # QoS is part of the key (the body may use it): a QoS 0 publish is asked on its own
    client.publish("ok/cached", b"x", qos=0)
    wait_until(lambda: service.asked("publish", "ok/cached") == 2, 10, "QoS 0 asked")

    def asked_again() -> bool:
        assert client.publish("ok/cached", b"x", qos=1) in (0, 0x10)
        return service.asked("publish", "ok/cached") == 3

    wait_until(asked_again, 10, "the decision to expire")
    assert time.monotonic() - first >= ttl  # not asked again while the decision held
    # with the cache off, every action asks
    uncached = start_broker(data_dir=broker.data_dir.parent / "uncached", **{
        "authorization.http.url": f"http://127.0.0.1:{service.port}/authz",
        "authorization.cache.enable": "false"})
    other = _client(clients, uncached.tcp)
    for _ in range(3):
        assert other.publish("ok/uncached", b"x", qos=1) in (0, 0x10)
    assert service.asked("publish", "ok/uncached") == 3


STORM = 200  # gmqtt clients subscribing at once to topics the slow service must decide
STORM_INFLIGHT = 8  # authorization.http.max_inflight
PROBE_BOUND_S = 1.0  # a responsive broker's round trip, however loaded the machine is


async def _storm(port: int) -> list[tuple[int, float]]:
    """STORM clients each SUBSCRIBE to a topic the slow service is asked about: each one's
    SUBACK code and how long it took."""
    stormers = [GmqttClient(port, f"storm-{n}") for n in range(STORM)]
    try:
        await asyncio.gather(*(client.connect() for client in stormers))

        async def storm(client: GmqttClient, number: int) -> tuple[int, float]:
            started = time.monotonic()
            codes = await client.subscribe(f"slow/{number}", 1)
            return codes[0], time.monotonic() - started

        return await asyncio.gather(*(storm(client, n) for n, client in enumerate(stormers)))
    finally:
        await asyncio.gather(*(client.close() for client in stormers))


def test_a_slow_service_under_many_subscribing_clients(
        start_broker: Callable[..., BrokerProcess], service: AuthzService) -> None:
    """At most max_inflight actions wait for the slow service; the rest are refused at once
    with 0x97 and counted, and a client whose actions are decided meanwhile sees the
    broker as responsive as ever. Unbounded, all would wait SLOW_S and be granted."""
    broker = start_broker(**{
        "authorization.http.url": f"http://127.0.0.1:{service.port}/authz",
        "authorization.http.max_inflight": str(STORM_INFLIGHT),
        "authorization.http.pool_size": str(STORM_INFLIGHT),
        "authorization.http.request_timeout": f"{SLOW_S * 5}s"})
    # A probe publishes at QoS 1 to a topic decided (and cached) before the storm: granted
    # each time (0x10, no subscribers, is a success).
    probe = RoundTripProbe(
        broker.tcp, unique("probe"), lambda n: Publish("ok/probe", b"", 1, packet_id=n + 1),
        lambda answer: isinstance(answer, Puback) and answer.reason_code < 0x80)
    try:
        answers = asyncio.run(asyncio.wait_for(_storm(broker.tcp), 120))
    finally:
        slowest_probe, rounds = probe.stop()
    refused = assert_bounded_storm(answers, 1, 0x97, STORM_INFLIGHT, SLOW_S)
    assert broker.metric("mqtt_authz_unavailable_total", action="subscribe",
                         reason="busy") == refused
    assert rounds >= 3 and slowest_probe < PROBE_BOUND_S, (rounds, slowest_probe)
