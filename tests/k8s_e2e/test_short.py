"""`make test`'s short run on the node: the chart's operator pod makes one broker pod,
which runs, passes its probes and serves MQTT through the client Service's ClusterIP."""

import pytest

from tests.k8s.conftest import Testbed
from tests.k8s_e2e.cluster import install, mosquitto, service_ip, wait_brokers


@pytest.mark.timeout(600)
def test_one_broker_pod_runs_and_serves_mqtt_through_its_service(
        node: Testbed, release: tuple[str, str]) -> None:
    namespace, name = release
    install(node, namespace, name, "cluster.replicas=1")
    [pod] = wait_brokers(node, namespace, name, 1)
    assert pod["status"]["phase"] == "Running"
    host = service_ip(node, namespace, name)
    mosquitto("mosquitto_pub", host, "-q", "1", "-r", "-t", "e2e/short", "-m",
              "through the Service")
    got = mosquitto("mosquitto_sub", host, "-q", "1", "-t", "e2e/short", "-C", "1", "-W", "30")
    assert got.strip() == "through the Service"
