"""spec.auth, spec.acl, spec.tls and spec.service rendered: the broker's own loader and
password parser read what the operator writes, and the pods mount the files the config
names, from the Secrets and ConfigMaps the spec names, without copying a secret anywhere."""

from pathlib import PurePosixPath
from typing import Any

import pytest

from broker.auth.passwords import parse_password_file
from broker.config.loader import load_config
from mqtt_operator import broker_config, manifests, reconcile
from mqtt_operator import constants as c
from mqtt_operator.spec import Cluster
from tests.support.crd import body


def config_of(tmp_path: Any, cluster: Cluster) -> Any:
    path = tmp_path / "broker.toml"
    path.write_text(broker_config.render_toml(broker_config.settings(cluster, 3)))
    return load_config(path)


def mounted(cluster: Cluster) -> dict[str, tuple[str, dict[str, Any]]]:
    """File path in the container -> (volume source kind, the source), as kubelet lays out
    a volume's `items` under its mount path."""
    pod = manifests.statefulset(cluster, 3, "x")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    files = {}
    for volume in pod["volumes"]:
        kind = "secret" if "secret" in volume else "configMap"
        for item in volume.get(kind, {}).get("items", []):
            files[str(PurePosixPath(mounts[volume["name"]]) / item["path"])] = (
                kind, {**volume[kind], "key": item["key"]})
    return files


def test_defaults_refuse_anonymous_clients_and_serve_a_generated_user(tmp_path: Any) -> None:
    cluster = Cluster.from_body(body("web"))
    config = config_of(tmp_path, cluster)
    assert config["authentication.allow_anonymous"] == "false"
    kind, source = mounted(cluster)[config["authentication.password_file"]]
    assert (kind, source["secretName"], source["key"]) == ("secret", "web-mqtt-user", "passwd")
    assert source["defaultMode"] == 0o440
    secret = manifests.user_secret(cluster, "s3cret-Pass")
    assert secret["metadata"]["name"] == "web-mqtt-user"
    data = secret["stringData"]
    assert (data["username"], data["password"]) == ("mqtt", "s3cret-Pass")
    users, warnings = parse_password_file(data[source["key"]], "passwd")
    assert not warnings
    assert set(users) == {"mqtt"}
    stored = users["mqtt"]
    assert stored is not None and stored.matches(b"s3cret-Pass")
    assert not stored.matches(b"s3cret-pass")
    # No TLS listener and no ACL unless asked for
    assert config["listeners.ssl.default.ssl_options.certfile"] == ""
    assert config["authorization.acl_file"] == ""


def test_each_generated_password_file_has_its_own_salt() -> None:
    assert manifests.password_line("u", "p") != manifests.password_line("u", "p")


def test_a_password_secret_of_ones_own_replaces_the_generated_user(tmp_path: Any) -> None:
    cluster = Cluster.from_body(body(auth={"allowAnonymous": True,
                                           "passwordSecret": {"name": "fleet", "key": "users"}}))
    config = config_of(tmp_path, cluster)
    assert config["authentication.allow_anonymous"] == "true"
    kind, source = mounted(cluster)[config["authentication.password_file"]]
    assert (kind, source["secretName"], source["key"]) == ("secret", "fleet", "users")
    created: list[dict[str, Any]] = []

    class Kube:
        def create(self, manifest: dict[str, Any]) -> bool:
            created.append(manifest)
            return True

    reconcile.ensure_user(Kube(), cluster, lambda *_: None)  # type: ignore[arg-type]
    assert created == []
    default = Cluster.from_body(body())
    events: list[tuple[str, str, str]] = []
    reconcile.ensure_user(Kube(), default, lambda *event: events.append(event))  # type: ignore[arg-type]
    [secret] = created
    password = secret["stringData"]["password"]
    assert len(password) >= 24
    [(_, reason, message)] = events
    assert reason == "UserCreated" and password not in message


@pytest.mark.parametrize("acl", [{"configMapName": "rules"}, {"secretName": "rules",
                                                               "key": "acl.conf"}])
def test_acl_comes_from_a_config_map_or_a_secret(tmp_path: Any, acl: dict[str, str]) -> None:
    cluster = Cluster.from_body(body(acl=acl))
    config = config_of(tmp_path, cluster)
    kind, source = mounted(cluster)[config["authorization.acl_file"]]
    assert kind == ("configMap" if "configMapName" in acl else "secret")
    assert source.get("name", source.get("secretName")) == "rules"
    assert source["key"] == acl.get("key", "acl")


@pytest.mark.parametrize("verify_peer", [False, True])
def test_tls_listener_serves_the_secrets_certificate(tmp_path: Any, verify_peer: bool) -> None:
    cluster = Cluster.from_body(body("web", tls={"secretName": "web-tls",
                                                 "verifyPeer": verify_peer}))
    config = config_of(tmp_path, cluster)
    prefix = "listeners.ssl.default.ssl_options."
    files = mounted(cluster)
    assert config["listeners.ssl.default.bind"] == ("0.0.0.0", 8883)
    for setting, key in (("certfile", "tls.crt"), ("keyfile", "tls.key")):
        kind, source = files[config[prefix + setting]]
        assert (kind, source["secretName"], source["key"]) == ("secret", "web-tls", key)
    if verify_peer:
        assert files[config[prefix + "cacertfile"]][1]["key"] == "ca.crt"
        assert config[prefix + "verify"] == "verify_peer"
        assert config[prefix + "fail_if_no_peer_cert"] is True
    else:
        assert config[prefix + "verify"] == "verify_none"
        assert not any(path.endswith("ca.crt") for path in files)
    [container] = manifests.statefulset(cluster, 3, "x")["spec"]["template"]["spec"]["containers"]
    assert {"name": "mqtts", "containerPort": 8883, "protocol": "TCP"} in container["ports"]
    service = manifests.client_service(cluster)
    assert {"name": "mqtts", "port": 8883, "targetPort": "mqtts", "protocol": "TCP"} in (
        service["spec"]["ports"])
    assert "mqtts" not in {p["name"] for p in manifests.client_service(
        Cluster.from_body(body()))["spec"]["ports"]}


def test_spec_config_cannot_open_the_door(tmp_path: Any) -> None:
    cluster = Cluster.from_body(body(config={
        "authentication.allow_anonymous": "true", "authentication.password_file": "",
        "authorization.acl_file": "/tmp/acl",
        "listeners.ssl.default.ssl_options.certfile": "/tmp/cert"}))
    config = config_of(tmp_path, cluster)
    assert config["authentication.allow_anonymous"] == "false"
    assert config["authentication.password_file"] == f"{c.USERS_DIR}/passwd"
    assert config["authorization.acl_file"] == ""
    assert config["listeners.ssl.default.ssl_options.certfile"] == ""
    assert len(broker_config.ignored_keys(cluster)) == 4


def test_service_takes_type_annotations_ranges_and_traffic_policy() -> None:
    service = {"type": "LoadBalancer", "annotations": {"lb.example/internal": "true"},
               "loadBalancerSourceRanges": ["10.0.0.0/8"], "externalTrafficPolicy": "Local"}
    cluster = Cluster.from_body(body(service=service))
    rendered = manifests.client_service(cluster)
    assert rendered["metadata"]["annotations"] == {"lb.example/internal": "true"}
    assert rendered["spec"]["type"] == "LoadBalancer"
    assert rendered["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert rendered["spec"]["externalTrafficPolicy"] == "Local"
    assert reconcile.problems(cluster) == []


def test_service_fields_its_type_does_not_take_are_left_out_and_reported() -> None:
    cluster = Cluster.from_body(body(service={"loadBalancerSourceRanges": ["10.0.0.0/8"],
                                              "externalTrafficPolicy": "Local"}))
    rendered = manifests.client_service(cluster)["spec"]
    assert rendered["type"] == "ClusterIP"
    assert "loadBalancerSourceRanges" not in rendered
    assert "externalTrafficPolicy" not in rendered
    assert [p.split()[0] for p in reconcile.problems(cluster)] == [
        "spec.service.loadBalancerSourceRanges", "spec.service.externalTrafficPolicy"]


def test_the_old_listeners_service_type_still_counts_unless_spec_service_says() -> None:
    old = Cluster.from_body(body(listeners={"serviceType": "NodePort"}))
    assert manifests.client_service(old)["spec"]["type"] == "NodePort"
    both = Cluster.from_body(body(listeners={"serviceType": "NodePort"},
                                  service={"type": "LoadBalancer"}))
    assert manifests.client_service(both)["spec"]["type"] == "LoadBalancer"
