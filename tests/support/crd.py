"""MQTTCluster bodies as the API server returns them: the CRD's own defaults applied.

Unit tests build clusters this way so they exercise the defaults users get, read from
crds/mqttcluster.yaml rather than restated in test code.
"""

import copy
from pathlib import Path
from typing import Any

import yaml

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "mqttcluster.yaml"
CRD: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
SCHEMA: dict[str, Any] = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _default(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = _default(value[name], prop)
    elif isinstance(value, list) and "items" in schema:
        return [_default(item, schema["items"]) for item in value]
    return value


def body(name: str = "mqc", namespace: str = "ns", **spec: Any) -> dict[str, Any]:
    return _default({
        "apiVersion": "mqtt.durablemqtt.io/v1alpha1", "kind": "MQTTCluster",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 1},
        "spec": copy.deepcopy(spec),
    }, SCHEMA)
