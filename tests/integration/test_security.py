"""Password authentication and the ACL file, on a live broker with real clients; the same
password file on Mosquitto 2.0 for comparison."""

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.mqtt.codec import encode
from broker.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from tests.integration.clients import PahoClient, unique, wait_until
from tests.protocol.rawclient import RawClient
from tests.support.broker_process import BrokerProcess

MOSQUITTO = "/usr/sbin/mosquitto"

ACL = """\
# anonymous clients: nothing but their own corner
topic readwrite anon/#

user alice
topic readwrite #
topic deny test/nosubscribe
topic deny secret/#
topic write will/alice

user bob
topic read public/#

pattern readwrite devices/%c/#
pattern read inbox/%u
"""


def _passwd(path: Path, user: str, password: str) -> None:
    create = [] if path.exists() else ["-c"]
    subprocess.run(["mosquitto_passwd", *create, "-b", str(path), user, password], check=True)


@pytest.fixture
def secured(start_broker: Callable[..., BrokerProcess],
            tmp_path: Path) -> Callable[..., BrokerProcess]:
    """secured(**settings): a broker with a mosquitto_passwd-made password file (alice,
    bob) and the ACL above."""
    passwords, acl = tmp_path / "passwd", tmp_path / "acl"
    _passwd(passwords, "alice", "wonder:land")
    _passwd(passwords, "bob", "builder")
    acl.write_text(ACL)
    return lambda **settings: start_broker(**{
        "authentication.password_file": str(passwords),
        "authorization.acl_file": str(acl), **settings})


def _connect(clients: list[PahoClient], port: int, user: str | None, password: str | None,
             version: int = 5, client_id: str = "", **options: object) -> PahoClient:
    client = PahoClient(port, client_id or unique("sec"), version=version)
    if user is not None:
        client.client.username_pw_set(user, password)
    clients.append(client)
    client.connect(expect_success=False, **options)  # type: ignore[arg-type]
    return client


def _code(client: PahoClient) -> int:
    assert client.connack is not None
    return client.connack.reason_code


def test_connack_codes_for_good_bad_and_missing_credentials(
        secured: Callable[..., BrokerProcess], clients: list[PahoClient]) -> None:
    broker = secured()
    port = broker.tcp
    assert _code(_connect(clients, port, "alice", "wonder:land")) == 0
    assert _code(_connect(clients, port, "alice", "wrong")) == 0x86
    assert _code(_connect(clients, port, "mallory", "x")) == 0x86
    assert _code(_connect(clients, port, None, None)) == 0x87
    for fields, return_code in (({"username": "alice", "password": b"wrong"}, 4), ({}, 5),
                                ({"username": "bob", "password": b"builder"}, 0)):
        assert _v3_return_code(port, fields) == return_code
    assert broker.metric("mqtt_auth_failures_total", reason="bad_password") == 2
    assert broker.metric("mqtt_auth_failures_total", reason="anonymous") == 2
    log = broker.log_text()
    assert "wrong" not in log and "refused: BAD_USER_NAME_OR_PASSWORD" in log


def _until_closed(raw: RawClient, *packets: Packet) -> list[Packet]:
    """Sends `packets` in one write, so the broker reads them while the CONNECT's password
    is still being checked, and returns all it answers until it closes."""
    raw.send_raw(b"".join(encode(packet, raw.version) for packet in packets))
    answers = []
    while True:
        try:
            answers.append(raw.recv())
        except (ConnectionError, OSError):
            return answers


def test_packets_behind_a_connect_wait_for_its_password_check(
        secured: Callable[..., BrokerProcess]) -> None:
    broker = secured()
    topic = unique("held/t")
    raw = RawClient(broker.tcp)
    try:
        answers = _until_closed(
            raw, Connect(unique("held"), username="alice", password=b"wonder:land",
                         will=Will("will/alice", b"gone")),
            Subscribe(1, [Subscription(topic, 1)]), Publish(topic, b"m", 1, packet_id=2),
            Pingreq(), Disconnect())
    finally:
        raw.close()
    assert isinstance(answers[0], Connack) and answers[0].reason_code == 0
    assert isinstance(answers[1], Suback) and answers[1].reason_codes == [1]
    assert {type(a) for a in answers[2:4]} == {Puback, Publish}  # its own message back
    assert isinstance(answers[4], Pingresp) and len(answers) == 5


def test_a_refused_password_drops_the_packets_behind_it(
        secured: Callable[..., BrokerProcess], clients: list[PahoClient]) -> None:
    broker = secured()
    watcher = _connect(clients, broker.tcp, "alice", "wonder:land")
    watcher.subscribe("will/alice", qos=1)
    raw = RawClient(broker.tcp)
    try:
        answers = _until_closed(
            raw, Connect(unique("held"), username="alice", password=b"wrong"),
            Publish("will/alice", b"never", 1, packet_id=1), Pingreq())
    finally:
        raw.close()
    assert [(type(a), getattr(a, "reason_code", None)) for a in answers] == [(Connack, 0x86)]
    watcher.publish("will/alice", "after", qos=1)  # after "never", had it been routed
    assert [m.payload for m in watcher.wait_messages(1)] == [b"after"]
    assert broker.metric("mqtt_auth_failures_total", reason="bad_password") == 1


def _v3_return_code(port: int, fields: dict[str, object]) -> int:
    """The 3.1.1 CONNACK return code byte as sent (clients map it to a v5 reason)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(encode(Connect(unique("v3"), protocol_level=4, **fields), 4))  # type: ignore[arg-type]
        connack = b""
        while len(connack) < 4:
            chunk = sock.recv(4 - len(connack))
            assert chunk, "closed before CONNACK"
            connack += chunk
    assert connack[:2] == b"\x20\x02"
    return connack[3]


def test_mosquitto_accepts_and_refuses_the_same_file(
        tmp_path: Path, clients: list[PahoClient]) -> None:
    passwords = tmp_path / "passwd"
    _passwd(passwords, "alice", "wonder:land")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conf = tmp_path / "mosquitto.conf"
    # `user root`: as root Mosquitto would switch to its own user, who cannot read the
    # test's private directory.
    conf.write_text(f"listener {port} 127.0.0.1\npassword_file {passwords}\n"
                    "allow_anonymous false\nuser root\n")
    mosquitto = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _listening(port), 10, "mosquitto listening")
        assert _code(_connect(clients, port, "alice", "wonder:land")) == 0
        # Refused (Mosquitto 2.0.11 says 0x87 Not authorized where we say 0x86).
        assert _code(_connect(clients, port, "alice", "wrong")) in (0x86, 0x87)
    finally:
        mosquitto.terminate()
        mosquitto.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_users_added_with_broker_ctl_log_in_without_a_restart(
        secured: Callable[..., BrokerProcess], clients: list[PahoClient],
        tmp_path: Path) -> None:
    broker = secured()
    kept = _connect(clients, broker.tcp, "bob", "builder")
    assert kept.connected
    passwords = tmp_path / "passwd"
    subprocess.run([sys.executable, "-m", "broker", "ctl", "users", "add", "carol",
                    "--file", str(passwords), "--password", "c4rol"], check=True)
    wait_until(lambda: broker.metric("mqtt_security_reloads_total", result="ok") >= 1, 10,
               "the changed file reloaded")
    assert _code(_connect(clients, broker.tcp, "carol", "c4rol")) == 0
    assert kept.connected  # a reload drops no connection

    passwords.write_text(passwords.read_text() + "broken line without a colon\n")
    wait_until(lambda: broker.metric("mqtt_security_reloads_total", result="failed") >= 1, 10,
               "the broken file refused")
    wait_until(lambda: f"{passwords}:4: expected USERNAME:HASH" in broker.log_text(), 10,
               "the refusal logged with file and line")
    assert _code(_connect(clients, broker.tcp, "carol", "c4rol")) == 0  # previous version

    subprocess.run([sys.executable, "-m", "broker", "ctl", "users", "delete", "carol",
                    "--file", str(passwords)], check=False)
    passwords.write_text("\n".join(line for line in passwords.read_text().splitlines()
                                   if not line.startswith(("broken", "carol"))) + "\n")
    os.kill(broker.proc.pid, signal.SIGHUP)
    wait_until(lambda: _code(_connect(clients, broker.tcp, "carol", "c4rol")) == 0x86, 10,
               "carol gone after SIGHUP")


def test_a_bad_file_stops_start_up_naming_file_and_line(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite a/#\ntopic frob\nbogus line\n")
    result = subprocess.run(
        [sys.executable, "-m", "broker", "run", "--set", f"node.data_dir={tmp_path / 'd'}",
         "--set", f"authorization.acl_file={acl}", "--set",
         "listeners.tcp.default.bind=127.0.0.1:0"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert f"{acl}:4: unknown keyword 'bogus'" in result.stderr


def test_subscribe_failure_as_in_the_paho_interoperability_suite(
        secured: Callable[..., BrokerProcess], clients: list[PahoClient]) -> None:
    """paho.mqtt.testing's test_subscribe_failure: a denied filter fails in SUBACK (3.1.1:
    0x80, 5.0: 0x87), the others in the same SUBSCRIBE are granted."""
    broker = secured()
    for version, refused in ((4, 0x80), (5, 0x87)):
        client = _connect(clients, broker.tcp, "alice", "wonder:land", version=version)
        codes = client.subscribe([("test/nosubscribe", 2), ("test/ok", 1)])
        assert codes == [refused, 1]


def test_publish_read_and_will_checks(
        secured: Callable[..., BrokerProcess], clients: list[PahoClient]) -> None:
    broker = secured()
    alice = _connect(clients, broker.tcp, "alice", "wonder:land")
    alice.subscribe("#", qos=1)  # allowed: the deny rules do not match the filter "#"
    bob = _connect(clients, broker.tcp, "bob", "builder")
    assert bob.publish("public/news", "x", qos=1) == 0x87  # bob may only read
    assert alice.publish("secret/plans", "x", qos=1) == 0x87
    alice.publish("public/news", "hello", qos=1)
    alice.publish("other/topic", "seen", qos=1)
    got = alice.wait_messages(2)
    assert sorted(m.topic for m in got) == ["other/topic", "public/news"]
    # A broad subscription never carries a topic its client may not read: published by
    # someone allowed (retained), alice's `#` does not deliver it.
    device = _connect(clients, broker.tcp, "bob", "builder", client_id="sensor-7")
    assert device.connected
    assert device.publish("devices/sensor-7/temp", "21", qos=1) == 0  # %c pattern
    assert device.publish("devices/sensor-8/temp", "21", qos=1) == 0x87
    # Wills are checked at CONNECT.
    assert _code(_connect(clients, broker.tcp, "bob", "builder",
                          will={"topic": "public/will", "payload": b"x"})) == 0x87
    assert _code(_connect(clients, broker.tcp, "alice", "wonder:land",
                          will={"topic": "will/alice", "payload": b"x"})) == 0
    assert broker.metric("mqtt_acl_denied_total", action="write") >= 3


def test_retained_and_shared_subscriptions_are_checked(
        secured: Callable[..., BrokerProcess], clients: list[PahoClient]) -> None:
    broker = secured(**{"authentication.allow_anonymous": "true"})
    alice = _connect(clients, broker.tcp, "alice", "wonder:land")
    alice.publish("public/retained", "r", qos=1, retain=True)
    alice.publish("other/retained", "not for bob", qos=1, retain=True)
    bob = _connect(clients, broker.tcp, "bob", "builder")
    assert bob.subscribe("$share/g/public/#", qos=1) == [1]
    assert bob.subscribe("$share/g/other/#", qos=1) == [0x87]
    bob2 = _connect(clients, broker.tcp, "bob", "builder")
    assert bob2.subscribe("+/retained", qos=1) == [0x87]  # bob's rule is public/# only
    assert bob2.subscribe("public/#", qos=1) == [1]
    assert [m.payload for m in bob2.wait_messages(1)] == [b"r"]
    user = _connect(clients, broker.tcp, "bob", "builder")
    assert user.subscribe("inbox/bob", qos=1) == [1]  # %u pattern
    assert user.subscribe("inbox/alice", qos=1) == [0x87]


def test_deny_action_disconnect_closes_the_connection(
        secured: Callable[..., BrokerProcess], clients: list[PahoClient]) -> None:
    broker = secured(**{"authorization.deny_action": "disconnect"})
    bob = _connect(clients, broker.tcp, "bob", "builder")
    bob.client.publish("public/news", b"x", qos=1)
    assert bob.wait_disconnected() == 0x87


def test_mosquitto_clients_log_in_with_user_and_password(
        secured: Callable[..., BrokerProcess]) -> None:
    broker = secured()
    topic = unique("public/cli").replace("-", "/")
    sub = subprocess.Popen(["mosquitto_sub", "-p", str(broker.tcp), "-u", "bob", "-P",
                            "builder", "-t", topic, "-C", "1", "-W", "20"],
                           stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: broker.metric("mqtt_subscriptions") >= 1, 10, "bob subscribed")
        subprocess.run(["mosquitto_pub", "-p", str(broker.tcp), "-u", "alice", "-P",
                        "wonder:land", "-t", topic, "-m", "hi", "-q", "1"], check=True,
                       timeout=20)
        out, _ = sub.communicate(timeout=20)
        assert out.strip() == "hi"
        refused = subprocess.run(["mosquitto_pub", "-p", str(broker.tcp), "-u", "alice",
                                  "-P", "nope", "-t", topic, "-m", "x"], capture_output=True,
                                 text=True, timeout=20)
        assert refused.returncode != 0
    finally:
        if sub.poll() is None:
            sub.kill()
