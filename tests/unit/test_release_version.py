"""The release is written once (broker/version.py): the package, `broker --version`, the
chart's appVersion, the operator's default image and the image tag the build makes all
read or equal it, so a release cannot ship an image whose tag says another."""

import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from broker.version import RELEASE

ROOT = Path(__file__).resolve().parents[2]


def test_the_chart_app_version_is_the_release() -> None:
    chart = yaml.safe_load((ROOT / "helm/durable-mqtt/Chart.yaml").read_text())
    assert chart["appVersion"] == RELEASE


def test_the_operator_default_image_is_the_release() -> None:
    crd = yaml.safe_load((ROOT / "crds/mqttcluster.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["image"]["default"] == f"durable-mqtt-broker:{RELEASE}"


def test_the_package_version_reads_the_release() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "broker.version.RELEASE"}


def test_the_image_build_tags_the_release() -> None:
    """The line of tools/image/build.sh that sets the tag, run as the build runs it."""
    script = (ROOT / "tools/image/build.sh").read_text().splitlines()
    line = next(line for line in script if line.startswith("VERSION="))
    out = subprocess.run(["bash", "-c", f"{line}\necho \"$VERSION\""], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == RELEASE


def test_broker_version_prints_the_release() -> None:
    out = subprocess.run([sys.executable, "-m", "broker", "--version"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == RELEASE
