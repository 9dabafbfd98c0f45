"""A rotated `ca.crt` in a mounted Secret (kubelet's `..data` swap, nobody sending a signal)
is in force for new TLS handshakes without a restart: clients with a certificate from the new
CA get in, those from the CA it replaced no longer do, and connections made before keep
working. Real TLS clients: mosquitto_pub and paho."""

import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.clients import PahoClient, unique, wait_until
from tests.support.broker_process import BrokerProcess
from tests.support.pki import make_ca, publish_version, server_certificate, sign

pytestmark = pytest.mark.integration


def _publish(port: int, server_ca: Path, device: tuple[Path, Path]) -> bool:
    """Whether mosquitto_pub gets a QoS 1 message through with this client certificate."""
    done = subprocess.run(
        ["mosquitto_pub", "-p", str(port), "-h", "127.0.0.1", "-V", "5", "--cafile",
         str(server_ca), "--cert", str(device[0]), "--key", str(device[1]), "-t", "rotation",
         "-m", "x", "-q", "1"], capture_output=True, text=True, timeout=20)
    return done.returncode == 0


def test_a_rotated_ca_is_in_force_without_a_restart(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient],
        tmp_path: Path) -> None:
    server_ca, old_ca, new_ca = (make_ca(tmp_path, name) for name in ("server-ca", "old", "new"))
    old_device = sign(tmp_path, old_ca, "old-device", "/CN=old-device")
    new_device = sign(tmp_path, new_ca, "new-device", "/CN=new-device")
    server = server_certificate(tmp_path, server_ca)
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    publish_version(mounted, "v1", {"tls.crt": server[0], "tls.key": server[1],
                                    "ca.crt": old_ca[0]})
    broker = start_broker(**{
        "listeners.ssl.default.bind": "127.0.0.1:0",
        "listeners.ssl.default.ssl_options.certfile": str(mounted / "tls.crt"),
        "listeners.ssl.default.ssl_options.keyfile": str(mounted / "tls.key"),
        "listeners.ssl.default.ssl_options.cacertfile": str(mounted / "ca.crt"),
        "listeners.ssl.default.ssl_options.verify": "verify_peer",
        "listeners.ssl.default.ssl_options.fail_if_no_peer_cert": "true"})
    port = broker.ports["ssl"]
    assert _publish(port, server_ca[0], old_device)
    assert not _publish(port, server_ca[0], new_device)
    before = PahoClient(port, unique("before"), version=5)
    clients.append(before)
    before.client.tls_set(str(server_ca[0]), str(old_device[0]), str(old_device[1]),
                          cert_reqs=ssl.CERT_REQUIRED)
    before.connect()
    assert before.subscribe("rotation", 1) == [1]
    assert broker.proc is not None
    pid = broker.proc.pid

    publish_version(mounted, "v2", {"tls.crt": server[0], "tls.key": server[1],
                                    "ca.crt": new_ca[0]})
    wait_until(lambda: _publish(port, server_ca[0], new_device), 15, "the new CA in force")
    assert not _publish(port, server_ca[0], old_device)  # the replaced CA is dropped
    assert before.wait_message_on("rotation").payload == b"x"  # made before, still served
    assert broker.proc.pid == pid and broker.proc.poll() is None
