"""Who may connect, on every pod of a 3-pod release (`make test-k8s-e2e`): the ACL from a
ConfigMap holds on each broker (a client denied a topic by pod IP, allowed its own), and
with `verifyPeer` each pod's TLS listener refuses a client without a certificate, or with
one from another CA, and accepts one the Secret's `ca.crt` signed (mTLS)."""

from pathlib import Path

import pytest

from tests.k8s.conftest import Testbed
from tests.k8s_e2e.cluster import install, mosquitto, run_mosquitto, secret_value, wait_brokers
from tests.support.pki import make_ca, sign

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ACL = "user mqtt\ntopic readwrite e2e/#\n"


def test_the_acl_holds_on_every_pod_and_verify_peer_wants_a_certificate_from_the_ca(
        node: Testbed, release: tuple[str, str], tmp_path: Path) -> None:
    namespace, name = release
    ca = make_ca(tmp_path)
    server = sign(tmp_path, ca, "server", "/CN=mq")
    device = sign(tmp_path, ca, "device", "/CN=device-1")
    stranger = sign(tmp_path, make_ca(tmp_path, "other-ca"), "stranger", "/CN=device-2")
    # A kubernetes.io/tls Secret with ca.crt, as a cert-manager Certificate writes it.
    node.kubectl("create", "secret", "generic", "mq-tls", "-n", namespace,
                 "--type=kubernetes.io/tls", f"--from-file=tls.crt={server[0]}",
                 f"--from-file=tls.key={server[1]}", f"--from-file=ca.crt={ca[0]}")
    node.kubectl("create", "configmap", "mq-acl", "-n", namespace, f"--from-literal=acl={ACL}")
    install(node, namespace, name, "cluster.replicas=3", "cluster.tls.secretName=mq-tls",
            "cluster.tls.verifyPeer=true", "cluster.acl.configMapName=mq-acl")
    pods = wait_brokers(node, namespace, name, 3)
    login = ("-u", secret_value(node, namespace, f"{name}-mqtt-user", "username"),
             "-P", secret_value(node, namespace, f"{name}-mqtt-user", "password"))
    tls = ("-p", "8883", "--cafile", str(ca[0]), "--insecure")  # --insecure: no name check

    for pod in pods:
        ip, pod_name = pod["status"]["podIP"], pod["metadata"]["name"]
        denied = run_mosquitto("mosquitto_sub", ip, *login, "-t", "other/#", "-C", "1",
                               "-W", "10")
        assert "denied" in denied.stderr, (pod_name, denied)
        mosquitto("mosquitto_pub", ip, *login, "-q", "1", "-r", "-t", f"e2e/{pod_name}",
                  "-m", pod_name)
        got = mosquitto("mosquitto_sub", ip, *login, "-t", f"e2e/{pod_name}", "-C", "1",
                        "-W", "30")
        assert got.strip() == pod_name

        # mTLS: the right password is not enough without a certificate from the CA.
        for certificate in ((), ("--cert", str(stranger[0]), "--key", str(stranger[1]))):
            refused = run_mosquitto("mosquitto_pub", ip, *tls, *certificate, *login, "-t",
                                    "e2e/tls", "-m", "refused", timeout=30)
            assert refused.returncode != 0, (pod_name, certificate, refused)
        got = mosquitto("mosquitto_sub", ip, *tls, "--cert", str(device[0]), "--key",
                        str(device[1]), *login, "-t", f"e2e/{pod_name}", "-C", "1", "-W", "30")
        assert got.strip() == pod_name
