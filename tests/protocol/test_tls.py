"""The TLS listener with a real client: starts only when certfile and keyfile are set."""

import os
import signal
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from broker.mqtt.codec import encode
from broker.mqtt.packets import Connect
from tests.integration.clients import wait_until
from tests.support.broker_process import BrokerProcess
from tests.support.pki import make_ca, publish_version, server_certificate, sign


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


def test_publish_and_receive_over_tls(
    start_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    broker = start_broker(**{
        "listeners.ssl.default.bind": "127.0.0.1:0",
        "listeners.ssl.default.ssl_options.certfile": str(cert),
        "listeners.ssl.default.ssl_options.keyfile": str(key),
    })
    received: list[bytes] = []
    got = threading.Event()
    subscribed = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="tls-client",
                         protocol=mqtt.MQTTv5)
    client.tls_set(ca_certs=str(cert), cert_reqs=ssl.CERT_REQUIRED)
    client.on_subscribe = lambda *_args: subscribed.set()

    def on_message(_client: mqtt.Client, _userdata: object, message: mqtt.MQTTMessage) -> None:
        received.append(message.payload)
        got.set()

    client.on_message = on_message
    client.connect("127.0.0.1", broker.ports["ssl"])
    client.loop_start()
    try:
        client.subscribe("tls/t", qos=1)
        assert subscribed.wait(10)
        client.publish("tls/t", b"secret", qos=1)
        assert got.wait(10)
        assert received == [b"secret"]
    finally:
        client.loop_stop()
        client.disconnect()


def test_without_certificates_there_is_no_tls_listener(broker: BrokerProcess) -> None:
    assert "ssl" not in broker.ports
    assert {"tcp", "ws", "http"} <= set(broker.ports)


def _pki(directory: Path) -> dict[str, tuple[Path, Path]]:
    ca = make_ca(directory)
    return {"ca": ca, "server": server_certificate(directory, ca),
            "device": sign(directory, ca, "device", "/O=Acme/CN=device-1")}


def _mutual_tls_broker(start_broker: Callable[..., BrokerProcess], pki: dict[str, Any],
                       **settings: str) -> BrokerProcess:
    return start_broker(**{
        "listeners.ssl.default.bind": "127.0.0.1:0",
        "listeners.ssl.default.ssl_options.certfile": str(pki["server"][0]),
        "listeners.ssl.default.ssl_options.keyfile": str(pki["server"][1]),
        "listeners.ssl.default.ssl_options.cacertfile": str(pki["ca"][0]),
        "listeners.ssl.default.ssl_options.verify": "verify_peer",
        "listeners.ssl.default.ssl_options.fail_if_no_peer_cert": "true",
        **settings,
    })


def _handshake(port: int, ca: Path, client: tuple[Path, Path] | None) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return context.wrap_socket(sock, server_hostname="127.0.0.1")


def test_a_client_without_a_certificate_is_refused_when_one_is_required(
    start_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    pki = _pki(tmp_path)
    broker = _mutual_tls_broker(start_broker, pki)
    port = broker.ports["ssl"]
    with _handshake(port, pki["ca"][0], pki["device"]) as accepted:
        accepted.sendall(encode(Connect("with-cert", protocol_level=5), 5))
        assert accepted.recv(4)[:1] == b"\x20"  # CONNACK
    with pytest.raises((ssl.SSLError, ConnectionError)), \
            _handshake(port, pki["ca"][0], None) as refused:
        # TLS 1.3 reports the missing certificate on the first read.
        refused.sendall(encode(Connect("no-cert", protocol_level=5), 5))
        if not refused.recv(4):
            raise ConnectionError("closed")


def test_certificate_common_name_is_the_user_name_for_the_acl(
    start_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """mosquitto_pub with --cert/--key and no password: the certificate's CN is the user
    the ACL names (a password file is set, so anyone else needs a password)."""
    pki = _pki(tmp_path)
    passwords, acl = tmp_path / "passwd", tmp_path / "acl"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwords), "other", "pw"], check=True)
    acl.write_text("user device-1\ntopic write devices/device-1/#\n")
    broker = _mutual_tls_broker(start_broker, pki, **{
        "mqtt.peer_cert_as_username": "cn",
        "authentication.password_file": str(passwords),
        "authorization.acl_file": str(acl)})

    def publish(topic: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["mosquitto_pub", "-p", str(broker.ports["ssl"]), "-h", "127.0.0.1", "-V", "5",
             "--cafile", str(pki["ca"][0]), "--cert", str(pki["device"][0]), "--key",
             str(pki["device"][1]), "-t", topic, "-m", "x", "-q", "1"],
            capture_output=True, text=True, timeout=20)

    assert publish("devices/device-1/temp").returncode == 0
    assert broker.metric("mqtt_acl_denied_total", action="write") == 0
    denied = publish("devices/device-2/temp")
    assert broker.metric("mqtt_acl_denied_total", action="write") == 1, denied.stderr
    assert broker.metric("mqtt_auth_failures_total", reason="anonymous") == 0


def test_sighup_serves_a_renewed_certificate_to_new_connections(
    start_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    pki = _pki(tmp_path)
    broker = _mutual_tls_broker(start_broker, pki)
    first = _served(broker, pki)
    renewed = _renewed(tmp_path, pki)
    pki["server"][0].write_bytes(renewed[0].read_bytes())
    pki["server"][1].write_bytes(renewed[1].read_bytes())
    assert broker.proc is not None
    os.kill(broker.proc.pid, signal.SIGHUP)
    wait_until(lambda: _served(broker, pki) not in (None, first), 10,
               "the renewed certificate served")


def _served(broker: BrokerProcess, pki: dict[str, Any]) -> bytes | None:
    """The certificate a new connection is served."""
    with _handshake(broker.ports["ssl"], pki["ca"][0], pki["device"]) as connection:
        return connection.getpeercert(binary_form=True)


def _renewed(directory: Path, pki: dict[str, Any]) -> tuple[Path, Path]:
    return server_certificate(directory, pki["ca"], "renewed")


def _publish_version(mounted: Path, version: str, pair: tuple[Path, Path]) -> None:
    publish_version(mounted, version, dict(zip(("tls.crt", "tls.key"), pair, strict=True)))


def test_a_certificate_renewed_in_a_mounted_secret_is_served_without_a_signal(
    start_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """cert-manager renews the Secret, kubelet swaps the files, and nobody sends SIGHUP:
    the broker sees the files change."""
    pki = _pki(tmp_path)
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    _publish_version(mounted, "v1", pki["server"])
    pki["server"] = (mounted / "tls.crt", mounted / "tls.key")
    broker = _mutual_tls_broker(start_broker, pki)
    first = _served(broker, pki)
    _publish_version(mounted, "v2", _renewed(tmp_path, pki))
    wait_until(lambda: _served(broker, pki) not in (None, first), 10,
               "the renewed certificate served")
