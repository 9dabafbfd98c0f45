"""tools/ssa_port_proxy.py's one change to what it forwards: Service ports applied without
a protocol get TCP (what Kubernetes 1.21+ defaults); everything else passes unchanged."""

import importlib.util
import json
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "tools" / "ssa_port_proxy.py"
_spec = importlib.util.spec_from_file_location("ssa_port_proxy", SOURCE)
assert _spec is not None and _spec.loader is not None
proxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(proxy)


def test_service_ports_get_tcp_unless_they_name_a_protocol() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "d-svc"},
               "spec": {"clusterIP": "None", "ports": [
                   {"name": "driver-rpc-port", "port": 7078, "targetPort": 7078},
                   {"name": "dns", "port": 53, "protocol": "UDP"}]}}
    fixed = json.loads(proxy.with_protocols(json.dumps(service).encode()))
    assert [p.get("protocol") for p in fixed["spec"]["ports"]] == ["TCP", "UDP"]
    assert {**fixed, "spec": service["spec"]} == service  # nothing else changed


def test_other_bodies_pass_through_byte_for_byte() -> None:
    for body in (b'{"kind": "ConfigMap", "data": {"ports": "x"}}', b"kind: Service\n",
                 b'["not", "an", "object"]'):
        assert proxy.with_protocols(body) == body
    assert json.loads(proxy.with_protocols(b'{"kind": "Service"}')) == {"kind": "Service"}
