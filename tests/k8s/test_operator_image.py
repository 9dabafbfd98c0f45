"""The operator as its image runs it (kopf from the image's venv, as the chart's Deployment
starts it) against the test bed's API server: it logs in and reconciles a cluster."""

import os
import uuid
from pathlib import Path

import pytest

from tests.container.engine import BROKER_IMAGE, Engine, build_images, containers, detect
from tests.k8s.conftest import Testbed, cluster_manifest, eventually


@pytest.fixture(scope="module")
def engine() -> Engine:
    build_images(dict(os.environ))
    return detect(dict(os.environ))


@pytest.mark.timeout(600)
def test_operator_image_reconciles_through_the_api_server(
        engine: Engine, testbed: Testbed, namespace: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(testbed.kubeconfig.read_text())
    kubeconfig.chmod(0o644)  # the image's user is not root
    with containers(engine) as box:
        name = f"operator-{uuid.uuid4().hex[:8]}"
        # The host's network: the API server listens on its loopback only. No metrics
        # port, so nothing of the container listens there.
        box.run(name, BROKER_IMAGE, "run", "--standalone", f"--namespace={namespace}", "-m",
                "mqtt_operator.handlers", options=(
                    "--network", "host", "-v", f"{kubeconfig}:/kube/config:ro",
                    "-e", "KUBECONFIG=/kube/config", "-e", "MQTT_OPERATOR_METRICS_PORT=0",
                    "--entrypoint", "kopf", "--no-healthcheck"))
        testbed.apply(cluster_manifest("imaged", replicas=1), namespace)
        try:
            eventually(lambda: testbed.find("statefulset", "imaged", namespace), timeout=90,
                       what="the StatefulSet the operator in the image makes")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{box.logs(name)[-3000:]}") from error
        assert engine("inspect", "--format", "{{.State.Running}}", name).stdout.strip() == "true"
