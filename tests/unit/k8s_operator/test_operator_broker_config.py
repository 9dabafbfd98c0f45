"""The operator <-> broker contract, checked with the broker's own loader and a real shell."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from broker.cluster.discovery import RPC_PORT_NAME
from broker.config.loader import ConfigError, load_config
from broker.ds.site import ensure_site_id, read_site_id
from broker.http.auth import ADMINISTRATOR, VIEWER, ApiKeys
from mqtt_operator import broker_config, manifests
from mqtt_operator import constants as c
from mqtt_operator.spec import Cluster
from tests.support.crd import body


def write(tmp_path: Path, cluster: Cluster) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(broker_config.render_toml(broker_config.settings(cluster, 3)))
    return path


def test_rendered_config_loads_with_the_brokers_loader(tmp_path: Path) -> None:
    cluster = Cluster.from_body(body(
        durableStorage={"nShards": 8, "replicationFactor": 2},
        durableSessions={"batchSize": 50, "messageRetentionPeriod": "2h"},
        listeners={"httpPort": 18084},
        config={"mqtt.max_inflight": "64",
                "durable_storage.messages.layout.wildcard_thresholds": "[50, 5]",
                "node.data_dir": "/elsewhere"}))
    config = load_config(write(tmp_path, cluster))
    assert config["durable_storage.messages.n_shards"] == 8
    assert config["durable_storage.messages.replication_factor"] == 2
    assert config["durable_sessions.batch_size"] == 50
    assert config["durable_sessions.message_retention_period"] == 7200
    assert config["durable_sessions.session_gc_interval"] == 600  # the CRD default, 10m
    assert config["dashboard.listeners.http.bind"] == ("0.0.0.0", 18084)
    assert config["listeners.tcp.default.bind"] == ("0.0.0.0", 1883)
    assert config["mqtt.max_inflight"] == 64
    assert config["durable_storage.messages.layout.wildcard_thresholds"] == (50, 5)
    assert config["node.data_dir"] == "/data"  # managed: spec.config cannot move it
    assert broker_config.ignored_keys(cluster) == ["node.data_dir"]


def test_rendered_cluster_keys_form_a_k8s_discovered_cluster(tmp_path: Path) -> None:
    cluster = Cluster.from_body(body("web", "prod", listeners={"rpcPort": 5400}))
    config = load_config(write(tmp_path, cluster))
    assert config["cluster.name"] == "web"
    assert config["cluster.discovery_strategy"] == "k8s"
    assert config["cluster.k8s.service_name"] == "web-headless"
    assert config["cluster.k8s.namespace"] == "prod"
    assert config["cluster.k8s.address_type"] == "ip"
    assert config["cluster.k8s.apiserver"] == ""  # the pod's own, from its environment
    assert config["rpc.tcp_server_port"] == 5400
    assert config["rpc.listen_address"] == "0.0.0.0"
    assert config["node.cookie"] == ""  # the cookie itself is never in the file...
    assert config["node.cookie_file"] == "/etc/mqtt/cookie/cookie"  # ...only where it is
    assert load_config(write(tmp_path, Cluster.from_body(body())))[
        "rpc.tcp_server_port"] == 5369  # the CRD's default


def test_spec_config_cannot_touch_the_cluster_keys_nor_leak_a_cookie(tmp_path: Path) -> None:
    overrides = {"node.cookie": "leaked-cookie", "node.cookie_file": "/tmp/mine",
                 "cluster.name": "other", "cluster.discovery_strategy": "static",
                 "cluster.k8s.service_name": "x", "cluster.k8s.namespace": "y",
                 "cluster.k8s.address_type": "hostname",
                 "rpc.tcp_server_port": "1", "rpc.listen_address": "127.0.0.1",
                 "cluster.autoclean": "1h"}
    cluster = Cluster.from_body(body("web", config=overrides))
    text = broker_config.render_toml(broker_config.settings(cluster, 3))
    config = load_config(write(tmp_path, cluster))
    assert "leaked-cookie" not in text
    assert broker_config.ignored_keys(cluster) == sorted(set(overrides) - {"cluster.autoclean"})
    assert (config["cluster.name"], config["cluster.discovery_strategy"],
            config["rpc.tcp_server_port"], config["node.cookie_file"]) == (
        "web", "k8s", 5369, "/etc/mqtt/cookie/cookie")
    assert config["cluster.autoclean"] == 3600  # not managed: tunable through spec.config


def test_brokers_discover_the_headless_services_inter_node_port(tmp_path: Path) -> None:
    cluster = Cluster.from_body(body("web", "prod", listeners={"rpcPort": 6000}))
    config = load_config(write(tmp_path, cluster))
    headless = manifests.headless_service(cluster)
    pod = manifests.statefulset(cluster, 3, "")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert headless["spec"]["publishNotReadyAddresses"] is True  # listed before Ready
    assert headless["metadata"]["name"] == config["cluster.k8s.service_name"]
    assert headless["metadata"]["namespace"] == config["cluster.k8s.namespace"]
    target = next(p["targetPort"] for p in headless["spec"]["ports"]
                  if p["name"] == RPC_PORT_NAME)  # the Endpoints port the brokers dial
    assert {p["name"]: p["containerPort"] for p in container["ports"]}[target] == config[
        "rpc.tcp_server_port"]
    role, binding = manifests.broker_role(cluster), manifests.broker_role_binding(cluster)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["endpoints"], "verbs": ["get"],
                              "resourceNames": [headless["metadata"]["name"]]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": "prod"}]


def test_the_pod_reads_the_cookie_where_the_config_says_from_the_secret(
        tmp_path: Path) -> None:
    cluster = Cluster.from_body(body("web"))
    cookie_file = Path(load_config(write(tmp_path, cluster))["node.cookie_file"])
    secret = manifests.cookie_secret(cluster, "s3cret")
    pod = manifests.statefulset(cluster, 3, "")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(cookie_file.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert mount["readOnly"] is True
    assert volume["secret"]["secretName"] == secret["metadata"]["name"] == "web-cookie"
    assert set(secret["stringData"]) == {cookie_file.name}
    assert "s3cret" not in json.dumps(manifests.statefulset(cluster, 3, ""))
    assert not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"]
                   for e in container["env"])  # nor in the environment


def test_the_pod_reads_its_api_keys_where_the_config_says_and_the_viewer_key_is_one(
        tmp_path: Path) -> None:
    """The mounted file is what the broker's own key loader reads; the basic-auth pair the
    operator and `kubectl mqtt` use is a viewer key of that file."""
    cluster = Cluster.from_body(body("web", config={"api_key.bootstrap_file": "/tmp/mine"}))
    keys_file = Path(load_config(write(tmp_path, cluster))["api_key.bootstrap_file"])
    assert broker_config.ignored_keys(cluster) == ["api_key.bootstrap_file"]  # managed
    secret = manifests.api_key_secret(cluster, "admin-s3cret", "viewer-s3cret")
    pod = manifests.statefulset(cluster, 3, "")["spec"]["template"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"]
                 if m["mountPath"] == str(keys_file.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert mount["readOnly"] is True
    assert volume["secret"]["secretName"] == secret["metadata"]["name"] == "web-api-key"
    data = secret["stringData"]
    (tmp_path / keys_file.name).write_text(data[keys_file.name])
    keys = ApiKeys(tmp_path / keys_file.name)
    assert keys.role("admin", "admin-s3cret") == ADMINISTRATOR
    assert keys.role(data["username"], data["password"]) == VIEWER
    assert "s3cret" not in json.dumps(manifests.statefulset(cluster, 3, ""))


def test_a_key_the_broker_does_not_know_fails_the_contract(tmp_path: Path) -> None:
    cluster = Cluster.from_body(body(config={"mqtt.no_such_key": "1"}))
    with pytest.raises(ConfigError, match=r"mqtt\.no_such_key"):
        load_config(write(tmp_path, cluster))


def test_rendering_is_byte_stable() -> None:
    one = Cluster.from_body(body(config={"b.x": "1", "a.y": "2"}))
    two = Cluster.from_body(body(config={"a.y": "2", "b.x": "1"}))
    render = broker_config.render_toml
    assert render(broker_config.settings(one, 3)) == render(broker_config.settings(two, 3))


@pytest.fixture
def pod(tmp_path: Path) -> dict[str, str]:
    """The pod's mounts and a `broker` on PATH that records its arguments instead of running."""
    (tmp_path / "sites").mkdir()
    (tmp_path / "config").mkdir()
    for ordinal, site in enumerate(["A1B2C3D4E5F60001", "A1B2C3D4E5F60002"]):
        (tmp_path / "sites" / str(ordinal)).write_text(site)
    cluster = Cluster.from_body(body())
    write(tmp_path / "config", cluster)
    fake = tmp_path / "bin" / "broker"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n"
                    "exec python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    fake.chmod(0o755)
    # A volume that holds its site, where the broker keeps it (a cluster node's DS root).
    ensure_site_id(tmp_path / "data" / "ds", "A1B2C3D4E5F60002")
    return {"PATH": f"{fake.parent}:{os.environ['PATH']}", "POD_NAMESPACE": "prod",
            "MQTT_HEADLESS_SERVICE": "mqc-headless", "MQTT_SITES_DIR": str(tmp_path / "sites"),
            "MQTT_CONFIG_DIR": str(tmp_path / "config"), "MQTT_DATA_DIR": str(tmp_path / "data"),
            "MQTT_VOLUME_SITE": ""}  # the downward API's value of an absent annotation


def run_pod(env: dict[str, str], pod_name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", manifests.POD_SCRIPT],
                          env={**env, "POD_NAME": pod_name}, capture_output=True, text=True,
                          timeout=10, check=False)


def test_pod_command_passes_its_ordinals_site_id(pod: dict[str, str]) -> None:
    done = run_pod(pod, "mqc-1")
    assert done.returncode == 0, done.stderr
    args = json.loads(done.stdout)
    assert args[:3] == ["run", "--config", f"{pod['MQTT_CONFIG_DIR']}/broker.toml"]
    overrides = [args[i + 1] for i, arg in enumerate(args) if arg == "--set"]
    config = load_config(args[2], overrides)
    assert config["node.site_id"] == "A1B2C3D4E5F60002"
    assert config["node.name"] == "broker@mqc-1.mqc-headless.prod.svc"
    assert not any("cookie" in arg for arg in args)  # argv is world-readable in /proc
    assert config["node.cookie_file"] == f"{c.COOKIE_DIR}/{c.COOKIE_KEY}"


def test_pod_without_a_published_site_id_refuses_to_start(pod: dict[str, str]) -> None:
    done = run_pod(pod, "mqc-7")
    assert done.returncode != 0
    assert done.stdout == ""  # the broker never ran with a made-up site


def test_a_new_volume_takes_the_site_the_operator_bound_to_its_claim(
        pod: dict[str, str], tmp_path: Path) -> None:
    """The site file is where the broker keeps it, and the command looks there."""
    assert read_site_id(tmp_path / "data" / "ds") is not None
    (Path(pod["MQTT_DATA_DIR"]) / c.SITE_ID_FILE).unlink()  # a new (or replaced) volume
    waiting = run_pod(pod, "mqc-1")
    assert waiting.returncode != 0 and waiting.stdout == ""  # no site named yet: no broker
    assert "waits for the operator to name its site" in waiting.stderr
    done = run_pod({**pod, "MQTT_VOLUME_SITE": "0123456789abcdef"}, "mqc-1")
    assert done.returncode == 0, done.stderr
    args = json.loads(done.stdout)
    assert "node.site_id=0123456789abcdef" in args  # the bound site, not the ordinal's old one


def test_a_cluster_forms_from_as_many_pods_as_it_was_created_with() -> None:
    """Each pod waits for its peers before the first Raft group is made (never the default
    1: pods whose first discovery saw only themselves each made a group, never merged)."""
    assert [broker_config.bootstrap_sites(n) for n in (1, 3, 5, 9)] == [1, 3, 5, 5]
    cluster = Cluster.from_body(body())
    assert broker_config.settings(cluster, 3)["durable_storage.n_sites"] == 3
    assert "durable_storage.n_sites" in broker_config.MANAGED_KEYS


@pytest.mark.parametrize("timeout", [None, "5s", "500ms", "1m", "90", "2.5s", "1h"])
def test_the_grace_period_outlasts_the_graceful_stop_the_broker_reads(
        tmp_path: Path, timeout: str | None) -> None:
    """kubelet's SIGKILL comes terminationGracePeriodSeconds after SIGTERM: never before the
    hand-over the broker was configured for, plus the flush after it."""
    config = {} if timeout is None else {broker_config.GRACEFUL_STOP_KEY: timeout}
    cluster = Cluster.from_body(body(config=config))
    stop = load_config(write(tmp_path, cluster))[broker_config.GRACEFUL_STOP_KEY]
    grace = manifests.statefulset(cluster, 3, "config")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    assert grace == broker_config.termination_grace_seconds(cluster)
    assert stop + broker_config.STOP_FLUSH_SECONDS <= grace < stop + \
        broker_config.STOP_FLUSH_SECONDS + 1


def test_a_graceful_stop_the_broker_would_refuse_leaves_the_default_grace() -> None:
    cluster = Cluster.from_body(body(config={broker_config.GRACEFUL_STOP_KEY: "soon"}))
    assert broker_config.termination_grace_seconds(cluster) == (
        broker_config.GRACEFUL_STOP_DEFAULT + broker_config.STOP_FLUSH_SECONDS)
