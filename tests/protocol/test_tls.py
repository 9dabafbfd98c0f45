"""The TLS listener with a real client: starts only when certfile and keyfile are set."""

import ssl
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt

from tests.support.broker_process import BrokerProcess


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
