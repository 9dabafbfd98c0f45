"""`make test`'s short run on the node: the chart's defaults plus a TLS Secret make one broker
pod, which passes its probes and serves MQTT through the client Service's ClusterIP the way
the release notes say: anonymous clients refused, the generated user accepted, MQTT over
TLS with the Secret's certificate, the ACL from a ConfigMap enforced; a rotated password and
a renewed certificate reach the running pod without a restart."""

import json
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from broker.auth.passwords import make_hash
from tests.k8s.conftest import Testbed, eventually
from tests.k8s_e2e.cluster import (
    install,
    mosquitto,
    run_mosquitto,
    secret_value,
    service_ip,
    wait_brokers,
)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificate(directory: Path, ca: tuple[Path, Path], name: str) -> tuple[Path, Path]:
    """A server certificate from `ca`, as a cert-manager Issuer would sign it."""
    cert, key, request = (directory / f"{name}.crt", directory / f"{name}.key",
                          directory / f"{name}.csr")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=mq", "-keyout", str(key),
             "-out", str(request))
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-days", "1", "-out", str(cert))
    return cert, key


def _tls_secret(node: Testbed, namespace: str, pair: tuple[Path, Path]) -> None:
    """`kubectl apply` of a kubernetes.io/tls Secret: created, or updated in place."""
    manifest = node.kubectl("create", "secret", "tls", "mq-tls", "-n", namespace,
                            f"--cert={pair[0]}", f"--key={pair[1]}", "--dry-run=client",
                            "-o", "yaml").stdout
    node.kubectl("apply", "-f", "-", stdin=manifest)


def _served(host: str, ca: Path) -> bytes:
    """The certificate the TLS listener serves, checked against the CA (not against a name:
    the Service's IP is assigned after the certificate is made)."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    with socket.create_connection((host, 8883), timeout=10) as sock, context.wrap_socket(
            sock) as connection:
        served = connection.getpeercert(binary_form=True)
    assert served is not None
    return served


def _der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


@pytest.mark.timeout(600)
def test_a_default_release_is_closed_to_anonymous_clients_and_open_to_its_user(
        node: Testbed, release: tuple[str, str], tmp_path: Path) -> None:
    namespace, name = release
    ca = tmp_path / "ca.crt", tmp_path / "ca.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
             "/CN=test CA", "-keyout", str(ca[1]), "-out", str(ca[0]))
    first = _certificate(tmp_path, ca, "first")
    _tls_secret(node, namespace, first)
    node.kubectl("create", "configmap", "mq-acl", "-n", namespace,
                 "--from-literal=acl=user mqtt\ntopic readwrite e2e/#\n")
    install(node, namespace, name, "cluster.replicas=1", "cluster.tls.secretName=mq-tls",
            "cluster.acl.configMapName=mq-acl")
    [pod] = wait_brokers(node, namespace, name, 1)
    host = service_ip(node, namespace, name)

    # As NOTES.txt says: the generated user's name and password from its Secret.
    user = secret_value(node, namespace, f"{name}-mqtt-user", "username")
    password = secret_value(node, namespace, f"{name}-mqtt-user", "password")
    anonymous = run_mosquitto("mosquitto_pub", host, "-t", "e2e/short", "-m", "anonymous")
    assert anonymous.returncode != 0 and "not authori" in anonymous.stderr.lower(), anonymous
    wrong = run_mosquitto("mosquitto_pub", host, "-u", user, "-P", password + "x", "-t",
                          "e2e/short", "-m", "wrong")
    assert wrong.returncode != 0, wrong
    login = ("-u", user, "-P", password)
    mosquitto("mosquitto_pub", host, *login, "-q", "1", "-r", "-t", "e2e/short", "-m",
              "through the Service")
    got = mosquitto("mosquitto_sub", host, *login, "-q", "1", "-t", "e2e/short", "-C", "1",
                    "-W", "30")
    assert got.strip() == "through the Service"
    # The ACL from the ConfigMap: e2e/# only.
    denied = run_mosquitto("mosquitto_sub", host, *login, "-t", "other/#", "-C", "1", "-W", "10")
    assert "denied" in denied.stderr, denied

    # MQTT over TLS, with the Secret's certificate, for the same user.
    assert _served(host, ca[0]) == _der(first[0])
    tls = ("-p", "8883", "--cafile", str(ca[0]), "--insecure")  # --insecure: no name check
    got = mosquitto("mosquitto_sub", host, *tls, *login, "-t", "e2e/short", "-C", "1",
                    "-W", "30")
    assert got.strip() == "through the Service"
    assert run_mosquitto("mosquitto_pub", host, *tls, "-t", "e2e/x", "-m", "-").returncode

    # Rotations: a new password file and a renewed certificate, written into the Secrets.
    rotated = "rotated-" + password[::-1]
    node.kubectl("patch", "secret", f"{name}-mqtt-user", "-n", namespace, "--type", "merge",
                 "-p", json.dumps({"stringData": {
                     "passwd": f"{user}:{make_hash(rotated.encode())}\n"}}))
    renewed = _certificate(tmp_path, ca, "renewed")
    _tls_secret(node, namespace, renewed)

    def accepts(secret: str) -> bool:
        return run_mosquitto("mosquitto_pub", host, "-u", user, "-P", secret, "-t",
                             "e2e/rotated", "-m", "-").returncode == 0

    eventually(lambda: accepts(rotated), timeout=120, what="the rotated password accepted")
    assert not accepts(password)
    eventually(lambda: _served(host, ca[0]) == _der(renewed[0]), timeout=120,
               what="the renewed certificate served")
    # The same container as before the rotations (it may have started twice before then: a
    # pod faster than the operator waits for its site, contract section 2).
    [after] = wait_brokers(node, namespace, name, 1)
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]
    assert after["status"]["containerStatuses"] == pod["status"]["containerStatuses"]
    # The operator copied neither into its ConfigMaps nor into Events.
    shown = node.kubectl("get", "configmaps,events", "-n", namespace, "-o", "yaml").stdout
    assert password not in shown and rotated not in shown
