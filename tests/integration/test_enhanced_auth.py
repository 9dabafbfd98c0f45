"""MQTT 5 enhanced authentication (SCRAM-SHA-256/512) on a live broker, driven by a SCRAM
client written from the RFCs (tests/support/scram_client.py), not the broker's: users made
by `broker ctl users --scram` and by the HTTP API, re-authentication, and every failure
answered with its reason code, never left hanging."""

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.clients import unique
from tests.support.broker_process import BrokerProcess
from tests.support.raw_mqtt import (
    PINGREQ,
    PINGRESP,
    raw_connect_packet,
    read_until_closed,
    recv_packet,
)
from tests.support.scram_client import (
    AUTH_METHOD,
    ScramClient,
    auth_packet,
    connect_packet,
    open_socket,
    reply,
    scram_connect,
)

CONNACK, AUTH, DISCONNECT = 2, 15, 14


@pytest.fixture
def scram_broker(start_broker: Callable[..., BrokerProcess], tmp_path: Path) -> BrokerProcess:
    users = tmp_path / "scram.json"
    for name, password, extra in (("alice", "wonder,land=", []), ("root", "toor", ["--superuser"])):
        subprocess.run([sys.executable, "-m", "broker", "ctl", "users", "add", name, "--scram",
                        "--file", str(users), "--password", password, *extra], check=True)
    return start_broker(**{"authentication.scram.user_file": str(users),
                           "mqtt.idle_timeout": "2s"})


def _api(broker: BrokerProcess, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.ports['http']}/api/v5/authentication/"
        f"scram%3Abuilt_in_database/{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.parametrize("algorithm", ["sha256", "sha512"])
def test_scram_login_proves_both_sides_and_the_connection_works(
        scram_broker: BrokerProcess, algorithm: str) -> None:
    client = ScramClient("alice", "wonder,land=", algorithm)
    sock, connack = scram_connect(scram_broker.tcp, client, unique("scram"))
    with sock:
        assert (connack.type, connack.reason) == (CONNACK, 0)
        assert connack.properties[AUTH_METHOD] == client.method
        assert client.verify(connack.data), "the server did not prove it knows the user"
        sock.sendall(PINGREQ)
        assert recv_packet(sock) == PINGRESP


def test_failures_get_their_reason_codes(scram_broker: BrokerProcess) -> None:
    port = scram_broker.tcp
    for user, password in (("alice", "wrong"), ("mallory", "x")):
        sock, connack = scram_connect(port, ScramClient(user, password), unique("bad"))
        with sock:
            assert (connack.type, connack.reason) == (CONNACK, 0x86)
            read_until_closed(sock, 5)
    with open_socket(port) as sock:  # a method we do not offer
        sock.sendall(connect_packet(unique("m"), "SCRAM-SHA-1", b"n,,n=alice,r=abc"))
        answer = reply(sock)
        assert (answer.type, answer.reason) == (CONNACK, 0x8C)
    with open_socket(port) as sock:  # a malformed client-first: refused, not hung
        sock.sendall(connect_packet(unique("m"), "SCRAM-SHA-256", b"garbage"))
        answer = reply(sock)
        assert (answer.type, answer.reason) == (CONNACK, 0x86)
    with open_socket(port) as sock:  # anything but AUTH during the exchange (MQTT-3.1.2-30)
        sock.sendall(connect_packet(unique("m"), "SCRAM-SHA-256", b"n,,n=alice,r=abc"))
        assert reply(sock).type == AUTH
        sock.sendall(PINGREQ)
        answer = reply(sock)
        assert (answer.type, answer.reason) == (CONNACK, 0x82)
    with open_socket(port) as sock:  # another method in the AUTH than in CONNECT
        sock.sendall(connect_packet(unique("m"), "SCRAM-SHA-256", b"n,,n=alice,r=abc"))
        assert reply(sock).type == AUTH
        sock.sendall(auth_packet(0x18, "SCRAM-SHA-512", b"c=biws,r=abc,p=AAAA"))
        answer = reply(sock)
        assert (answer.type, answer.reason) == (CONNACK, 0x82)
    with open_socket(port) as sock:  # a client that stops half way is closed in time
        sock.sendall(connect_packet(unique("m"), "SCRAM-SHA-256", b"n,,n=alice,r=abc"))
        assert reply(sock).type == AUTH
        read_until_closed(sock, 5)
    assert scram_broker.metric("mqtt_auth_failures_total", reason="scram_bad_proof") == 1
    assert scram_broker.metric("mqtt_auth_failures_total", reason="scram_unknown_user") == 1


def test_reauthentication_on_a_live_connection(scram_broker: BrokerProcess) -> None:
    first = ScramClient("root", "toor")
    sock, connack = scram_connect(scram_broker.tcp, first, unique("re"))
    with sock:
        assert connack.reason == 0
        again = ScramClient("root", "toor")
        sock.sendall(auth_packet(0x19, again.method, again.first()))
        challenge = reply(sock)
        assert (challenge.type, challenge.reason) == (AUTH, 0x18)
        sock.sendall(PINGREQ)  # other packets go on during a re-authentication
        assert recv_packet(sock) == PINGRESP
        sock.sendall(auth_packet(0x18, again.method, again.final(challenge.data)))
        done = reply(sock)
        assert (done.type, done.reason) == (AUTH, 0) and again.verify(done.data)
        wrong = ScramClient("root", "nope")
        sock.sendall(auth_packet(0x19, wrong.method, wrong.first()))
        challenge = reply(sock)
        sock.sendall(auth_packet(0x18, wrong.method, wrong.final(challenge.data)))
        refused = reply(sock)
        assert (refused.type, refused.reason) == (DISCONNECT, 0x87)
        read_until_closed(sock, 5)


def test_users_managed_over_http_log_in_at_once(scram_broker: BrokerProcess) -> None:
    status, _ = _api(scram_broker, "POST", "users",
                     {"user_id": "carol", "password": "c4rol", "is_superuser": False})
    assert status == 201
    assert _api(scram_broker, "POST", "users", {"user_id": "carol", "password": "x"})[0] == 409
    assert _api(scram_broker, "POST", "users", {"user_id": "dave"})[0] == 400
    status, body = _api(scram_broker, "GET", "users")
    assert status == 200
    listed = json.loads(body)["data"]
    assert {"user_id": "carol", "is_superuser": False} in listed
    assert all(set(user) == {"user_id", "is_superuser"} for user in listed)  # no keys shown
    sock, connack = scram_connect(scram_broker.tcp, ScramClient("carol", "c4rol", "sha512"),
                                  unique("c"))
    sock.close()
    assert connack.reason == 0
    assert _api(scram_broker, "PUT", "users/carol", {"password": "new"})[0] == 200
    sock, connack = scram_connect(scram_broker.tcp, ScramClient("carol", "c4rol"), unique("c"))
    sock.close()
    assert connack.reason == 0x86
    assert _api(scram_broker, "DELETE", "users/carol")[0] == 204
    assert _api(scram_broker, "GET", "users/carol")[0] == 404


def test_without_a_user_file_an_authentication_method_gets_0x8c(broker: BrokerProcess) -> None:
    with open_socket(broker.tcp) as sock:
        sock.sendall(connect_packet(unique("m"), "SCRAM-SHA-256", b"n,,n=alice,r=abc"))
        answer = reply(sock)
        assert (answer.type, answer.reason) == (CONNACK, 0x8C)
    with open_socket(broker.tcp) as sock:  # AUTH without a method in CONNECT: 0x82
        sock.sendall(raw_connect_packet(unique("n"), 30, version=5))
        assert reply(sock).reason == 0
        sock.sendall(auth_packet(0x19, "SCRAM-SHA-256", b"n,,n=alice,r=abc"))
        answer = reply(sock)
        assert (answer.type, answer.reason) == (DISCONNECT, 0x82)
