"""The operator against a real API server and controller-manager (kopf in-process)."""

import base64
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.config.loader import load_config
from broker.http.auth import ADMINISTRATOR, VIEWER, parse_api_keys
from mqtt_operator import constants as c
from mqtt_operator import placement, sites
from tests.k8s.conftest import (
    FakeBrokers,
    Testbed,
    api_key_of,
    cluster_manifest,
    event_reasons,
    eventually,
    set_pod_ready,
)

CHILDREN = [("configmap", "{}-config"), ("configmap", "{}-sites"),
            ("configmap", "{}-placement"), ("secret", "{}-cookie"), ("secret", "{}-api-key"),
            ("service", "{}"),
            ("service", "{}-headless"), ("statefulset", "{}"), ("poddisruptionbudget", "{}"),
            ("servicemonitor", "{}")]


def status_of(testbed: Testbed, namespace: str, name: str) -> dict[str, Any]:
    return dict(testbed.get("mqc", name, namespace).get("status") or {})


def sts_replicas(testbed: Testbed, namespace: str, name: str) -> int | None:
    sts = testbed.find("statefulset", name, namespace)
    return None if sts is None else int(sts["spec"]["replicas"])


def published_plan(testbed: Testbed, namespace: str, name: str) -> dict[str, Any]:
    data = testbed.get("configmap", f"{name}-placement", namespace)["data"]
    return dict(json.loads(data["placement.json"]))


def test_security_spec_as_the_api_server_takes_it(
        testbed: Testbed, namespace: str, operator: Callable[[], Any], tmp_path: Path) -> None:
    """spec.auth, spec.acl, spec.tls and spec.service as the API server defaults and stores
    them and the children it accepts: the config names mounted files, the LoadBalancer keeps
    its ranges and policy, and the generated password is in its Secret only."""
    with operator():
        testbed.apply(cluster_manifest(
            "locked", replicas=1, acl={"configMapName": "locked-acl"},
            tls={"secretName": "locked-tls", "verifyPeer": True},
            service={"type": "LoadBalancer", "annotations": {"example.com/lb": "internal"},
                     "loadBalancerSourceRanges": ["10.1.0.0/16"],
                     "externalTrafficPolicy": "Local"}), namespace)
        sts = eventually(lambda: testbed.find("statefulset", "locked", namespace))
        user = eventually(lambda: testbed.find("secret", "locked-mqtt-user", namespace))
    (tmp_path / "broker.toml").write_text(
        testbed.get("configmap", "locked-config", namespace)["data"]["broker.toml"])
    config = load_config(tmp_path / "broker.toml")
    assert config["authentication.allow_anonymous"] == "false"  # the CRD's default
    pod = sts["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert config["authentication.password_file"] == f"{mounts['users']}/passwd"
    assert volumes["users"]["secret"]["secretName"] == "locked-mqtt-user"
    assert config["authorization.acl_file"] == f"{mounts['acl']}/acl"
    assert volumes["acl"]["configMap"]["name"] == "locked-acl"
    assert config["listeners.ssl.default.ssl_options.cacertfile"] == f"{mounts['tls']}/ca.crt"
    # verifyPeer: client certificates required, checked against the mounted ca.crt
    assert (config["listeners.ssl.default.ssl_options.verify"],
            config["listeners.ssl.default.ssl_options.fail_if_no_peer_cert"]) == (
        "verify_peer", True)
    assert [i["key"] for i in volumes["tls"]["secret"]["items"]] == [
        "tls.crt", "tls.key", "ca.crt"]
    service = testbed.get("service", "locked", namespace)
    assert service["metadata"]["annotations"]["example.com/lb"] == "internal"
    assert (service["spec"]["type"], service["spec"]["loadBalancerSourceRanges"],
            service["spec"]["externalTrafficPolicy"]) == ("LoadBalancer", ["10.1.0.0/16"],
                                                          "Local")
    assert {"name": "mqtts", "port": 8883} in [
        {k: port[k] for k in ("name", "port")} for port in service["spec"]["ports"]]
    password = base64.b64decode(user["data"]["password"]).decode()
    shown = testbed.kubectl("get", "configmaps,events,statefulsets,mqc", "-n", namespace,
                            "-o", "yaml").stdout
    assert password not in shown
    assert "UserCreated" in event_reasons(testbed, namespace, "locked")


def test_a_missing_secret_or_config_map_is_named_until_it_appears(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    """Objects spec.acl and spec.tls name that do not exist (or lack a key) make the cluster
    Degraded, naming them and their field; the condition clears once they are there, with
    no edit of the MQTTCluster (the operator looks again while something is missing)."""
    with operator():
        testbed.apply(cluster_manifest(
            "refs", replicas=1, acl={"configMapName": "refs-acl"},
            tls={"secretName": "refs-tls", "verifyPeer": True}), namespace)
        first = eventually(lambda: (d := condition(testbed, namespace, "refs", "Degraded"))
                           .get("reason") == "ConfigMapMissing" and d, what="ConfigMapMissing")
        assert "ConfigMap refs-acl (named by spec.acl) does not exist" in first["message"]
        assert "Secret refs-tls (named by spec.tls.secretName) does not exist" in \
            first["message"]
        assert status_of(testbed, namespace, "refs")["phase"] == "Degraded"
        testbed.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "refs-acl"},
                       "data": {"acl": "topic readwrite #\n"}}, namespace)
        pem = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()  # never parsed
        testbed.apply({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                       "metadata": {"name": "refs-tls"},
                       "data": {"tls.crt": pem, "tls.key": pem}}, namespace)
        lacking = eventually(lambda: (d := condition(testbed, namespace, "refs", "Degraded"))
                             .get("reason") == "SecretMissing" and d, what="SecretMissing")
        assert lacking["message"].startswith(
            "Secret refs-tls (named by spec.tls.secretName) has no key ca.crt")
        testbed.kubectl("patch", "secret", "refs-tls", "-n", namespace, "--type=merge", "-p",
                        json.dumps({"data": {"ca.crt": pem}}))
        cleared = eventually(lambda: (d := condition(testbed, namespace, "refs", "Degraded"))
                             .get("status") == "False" and d, what="Degraded cleared")
        assert cleared["reason"] == "SpecValid"
        assert "ConfigMapMissing" in event_reasons(testbed, namespace, "refs")


def test_children_as_the_api_server_stores_them_wire_up_a_cluster(
        testbed: Testbed, namespace: str, operator: Callable[[], Any], tmp_path: Path) -> None:
    """What the API server kept (defaults, pruning) still forms a cluster: the config loads
    with the broker's loader, the inter-node port is on pods and headless Service, peers are
    listed before Ready, and Ready means joined."""
    with operator():
        testbed.apply(cluster_manifest("wired", replicas=2, listeners={"rpcPort": 5400},
                                       durableStorage={"replicationFactor": 2}), namespace)
        sts = eventually(lambda: testbed.find("statefulset", "wired", namespace))
    headless = testbed.get("service", "wired-headless", namespace)["spec"]
    client = testbed.get("service", "wired", namespace)["spec"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    (tmp_path / "broker.toml").write_text(
        testbed.get("configmap", "wired-config", namespace)["data"]["broker.toml"])
    config = load_config(tmp_path / "broker.toml")
    assert (config["cluster.name"], config["cluster.discovery_strategy"],
            config["cluster.k8s.service_name"], config["cluster.k8s.namespace"],
            config["rpc.tcp_server_port"]) == ("wired", "k8s", "wired-headless", namespace, 5400)
    assert headless["publishNotReadyAddresses"] is True
    assert {"name": "rpc", "port": 5400, "targetPort": "rpc", "protocol": "TCP"} in headless[
        "ports"]
    assert "rpc" not in [port["name"] for port in client["ports"]]
    assert {"name": "rpc", "containerPort": 5400, "protocol": "TCP"} in container["ports"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/api/v5/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/status"
    assert config["api_key.bootstrap_file"] == "/etc/mqtt/api-key/api_keys"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert mounts["api-key"] == "/etc/mqtt/api-key"
    assert volumes["api-key"]["secret"]["secretName"] == "wired-api-key"


def condition(testbed: Testbed, namespace: str, name: str, kind: str) -> dict[str, Any]:
    return next((found for found in status_of(testbed, namespace, name).get("conditions", [])
                 if found["type"] == kind), {})


def cookie_of(testbed: Testbed, namespace: str, name: str) -> tuple[str, str, str]:
    """(uid, resourceVersion, cookie) of the cluster's cookie Secret."""
    secret = testbed.get("secret", f"{name}-cookie", namespace)
    return (secret["metadata"]["uid"], secret["metadata"]["resourceVersion"],
            base64.b64decode(secret["data"]["cookie"]).decode())


def test_cookie_secret_is_made_once_kept_hidden_and_never_silently_replaced(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    spec = {"replicas": 2, "durableStorage": {"replicationFactor": 2}}
    with operator():
        testbed.apply(cluster_manifest("kept", **spec), namespace)
        eventually(lambda: testbed.find("statefulset", "kept", namespace))
        first = cookie_of(testbed, namespace, "kept")
        assert re.fullmatch(r"[0-9a-f]{64}", first[2])
        testbed.apply(cluster_manifest("kept", config={"mqtt.max_inflight": "64"}, **spec),
                      namespace)
        eventually(lambda: 'max_inflight = "64"' in testbed.get(
            "configmap", "kept-config", namespace)["data"]["broker.toml"], what="reconciled")
        assert cookie_of(testbed, namespace, "kept") == first  # not rewritten, not rotated
        readable = json.dumps([testbed.items(kind, namespace) for kind in (
            "configmaps", "statefulsets", "pods", "mqttclusters", "events")])
        assert first[2] not in readable  # only the Secret holds it: not config, argv, env
        edit = testbed.kubectl("patch", "secret", "kept-cookie", "-n", namespace, "--type=merge",
                               "-p", '{"stringData": {"cookie": "other"}}', check=False)
        assert edit.returncode != 0 and "immutable" in edit.stderr

        testbed.kubectl("delete", "secret", "kept-cookie", "-n", namespace)
        eventually(lambda: testbed.find("pod", "kept-0", namespace))
        set_pod_ready(testbed, namespace, "kept-0")  # any event brings a reconcile
        missing = eventually(lambda: (d := condition(testbed, namespace, "kept", "Degraded"))
                             .get("reason") == "CookieMissing" and d, what="CookieMissing")
        assert "Secret kept-cookie (the brokers' cookie) was deleted" in missing["message"]
        assert status_of(testbed, namespace, "kept")["phase"] == "Degraded"
        assert testbed.find("secret", "kept-cookie", namespace) is None  # no new cookie
        assert "CookieMissing" in eventually(lambda: event_reasons(testbed, namespace, "kept"))
    # A StatefulSet of contract v1 mounts no cookie: upgrading the operator makes one.
    volumes = testbed.get("statefulset", "kept", namespace)["spec"]["template"]["spec"][
        "volumes"]
    index = [volume["name"] for volume in volumes].index("cookie")
    testbed.kubectl("patch", "statefulset", "kept", "-n", namespace, "--type=json", "-p",
                    json.dumps([{"op": "remove",
                                 "path": f"/spec/template/spec/volumes/{index}"}]))
    with operator():
        eventually(lambda: testbed.find("secret", "kept-cookie", namespace),
                   what="cookie made for a v1 StatefulSet")
        assert cookie_of(testbed, namespace, "kept")[2] != first[2]
        eventually(lambda: "cookie" in [volume["name"] for volume in testbed.get(
            "statefulset", "kept", namespace)["spec"]["template"]["spec"]["volumes"]])
    assert event_reasons(testbed, namespace, "kept").count("CookieCreated") == 2


def test_api_key_secret_is_made_once_read_for_every_call_and_rotated_in_place(
        testbed: Testbed, namespace: str, operator: Callable[[], Any],
        brokers: FakeBrokers) -> None:
    """The brokers' API keys: made with the cluster, the broker's bootstrap file format, in
    no ConfigMap, StatefulSet or Event; the operator asks the brokers with the viewer key,
    read again at every reconcile, so an edit in place rotates it; never rewritten by a
    reconcile; one without the viewer pair is reported; a deleted one is made anew."""
    spec = {"replicas": 2, "durableStorage": {"replicationFactor": 1},
            "listeners": {"httpPort": brokers.port}}
    with operator():
        testbed.apply(cluster_manifest("keyed", **spec), namespace)
        eventually(lambda: testbed.find("statefulset", "keyed", namespace))
        secret = testbed.get("secret", "keyed-api-key", namespace)
        data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        keys = parse_api_keys(data["api_keys"], "api_keys")  # as the brokers read it
        assert [(name, key.role) for name, key in keys.items()] == [
            ("admin", ADMINISTRATOR), ("viewer", VIEWER)]
        assert (data["username"], data["password"]) == ("viewer", keys["viewer"].secret.decode())
        assert all(re.fullmatch(rb"[0-9a-f]{64}", key.secret) for key in keys.values())
        assert "immutable" not in secret  # rotated by editing it
        readable = json.dumps([testbed.items(kind, namespace) for kind in (
            "configmaps", "statefulsets", "pods", "mqttclusters", "events")])
        assert not any(key.secret.decode() in readable for key in keys.values())

        ids = eventually(lambda: status_of(testbed, namespace, "keyed").get("siteIds"))
        for pod in ("keyed-0", "keyed-1"):
            eventually(lambda p=pod: testbed.find("pod", p, namespace), what=pod)
            set_pod_ready(testbed, namespace, pod)
        brokers.holding = {ids["1"]: [0]}  # a drain the operator keeps asking about
        testbed.kubectl("scale", "mqc/keyed", "-n", namespace, "--replicas=1")
        eventually(lambda: ids["1"] in brokers.asked, what="the leaving site asked")
        assert brokers.keys == {f"viewer:{data['password']}"}
        rotated = "f" * 64
        testbed.kubectl("patch", "secret", "keyed-api-key", "-n", namespace, "--type=merge",
                        "-p", json.dumps({"stringData": {
                            "password": rotated, "api_keys": f"viewer:{rotated}:viewer\n"}}))
        eventually(lambda: f"viewer:{rotated}" in brokers.keys, what="the rotated key used")
        brokers.holding = {}
        eventually(lambda: sts_replicas(testbed, namespace, "keyed") == 1)
        assert api_key_of(testbed, namespace, "keyed") == f"viewer:{rotated}"  # not rewritten

        testbed.kubectl("patch", "secret", "keyed-api-key", "-n", namespace, "--type=json",
                        "-p", '[{"op": "remove", "path": "/data/username"}]')
        testbed.apply(cluster_manifest("keyed", config={"mqtt.max_inflight": "64"},
                                       **{**spec, "replicas": 1}), namespace)
        unusable = eventually(lambda: (d := condition(testbed, namespace, "keyed", "Degraded"))
                              .get("reason") == "ApiKeyUnusable" and d, what="ApiKeyUnusable")
        assert "Secret keyed-api-key has no `username` and `password`" in unusable["message"]

        testbed.kubectl("delete", "secret", "keyed-api-key", "-n", namespace)
        testbed.apply(cluster_manifest("keyed", config={"mqtt.max_inflight": "32"},
                                       **{**spec, "replicas": 1}), namespace)
        eventually(lambda: condition(testbed, namespace, "keyed", "Degraded").get(
            "reason") == "SpecValid", what="a new Secret, usable")
        assert api_key_of(testbed, namespace, "keyed") not in (
            f"viewer:{rotated}", f"viewer:{data['password']}")
        eventually(lambda: event_reasons(testbed, namespace, "keyed").count(
            "ApiKeyCreated") == 2, what="a second ApiKeyCreated")


def test_apply_creates_owned_children_status_events_and_metrics(
        testbed: Testbed, namespace: str, operator: Callable[[], Any],
        operator_env: dict[str, str]) -> None:
    with operator() as runner:
        testbed.apply(cluster_manifest("alpha", replicas=3), namespace)
        uid = testbed.get("mqc", "alpha", namespace)["metadata"]["uid"]
        for kind, pattern in CHILDREN:
            child = eventually(lambda k=kind, p=pattern: testbed.find(
                k, p.format("alpha"), namespace), what=f"{kind} {pattern}")
            owners = child["metadata"]["ownerReferences"]
            assert [(o["uid"], o["kind"], o["controller"]) for o in owners] == [
                (uid, "MQTTCluster", True)], kind
        status = eventually(lambda: status_of(testbed, namespace, "alpha").get("placement"))
        full = status_of(testbed, namespace, "alpha")
        assert full["observedGeneration"] == 1
        assert sorted(full["siteIds"]) == ["0", "1", "2"]
        assert [s["state"] for s in full["sites"]] == ["down", "down", "down"]
        assert full["phase"] == "Pending"
        assert len(status["shards"]) == 16
        assert full["transitions"] == []  # a first plan creates shards, it moves nothing
        assert all(len(members) == 3 for members in status["shards"].values())
        sites_map = testbed.get("configmap", "alpha-sites", namespace)["data"]
        # What pods read is what status shows (beside each site's claim).
        assert sites.merge_known(sites_map, None) == sites.merge_known(full["siteIds"], None)
        assert {"SitesAssigned", "PlacementChanged"} <= set(eventually(
            lambda: event_reasons(testbed, namespace, "alpha")))
        # Broker pods becoming ready (reported by the test: no kubelet here) show in status.
        for ordinal in range(3):
            pod = f"alpha-{ordinal}"
            eventually(lambda p=pod: testbed.find("pod", p, namespace), what=pod)
            set_pod_ready(testbed, namespace, pod)
        eventually(lambda: status_of(testbed, namespace, "alpha").get("phase") == "Running")
        final = status_of(testbed, namespace, "alpha")
        assert final["readyReplicas"] == 3
        assert {c["type"]: c["status"] for c in final["conditions"]}["Ready"] == "True"
        url = f"http://127.0.0.1:{operator_env['MQTT_OPERATOR_METRICS_PORT']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            metrics = response.read().decode()
    assert re.search(r'^mqtt_operator_reconciles_total\{trigger="change"\} [1-9]', metrics, re.M)
    assert re.search(r'^mqtt_operator_reconciles_total\{trigger="pod"\} [1-9]', metrics, re.M)
    assert "mqtt_operator_reconcile_duration_seconds_count" in metrics
    assert "mqtt_operator_reconcile_failures_total" in metrics
    assert "Handler 'on_change' succeeded" in runner.output


def conditions_of(testbed: Testbed, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status_of(testbed, namespace, name).get("conditions", [])}


def test_spec_problems_are_reported_naming_the_field(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    with operator():
        testbed.apply(cluster_manifest("odd", replicas=2, durableStorage={"nShards": 4},
                                       config={"node.site_id": "X"}), namespace)
        degraded = eventually(lambda: conditions_of(testbed, namespace, "odd").get("Degraded"))
        testbed.kubectl("patch", "mqc", "odd", "-n", namespace, "--type=merge",
                        "-p", '{"spec": {"durableStorage": {"nShards": 8}}}')
        message = eventually(lambda: "nShards cannot change" in (m := conditions_of(
            testbed, namespace, "odd")["Degraded"]["message"]) and m)
        config = testbed.get("configmap", "odd-config", namespace)["data"]["broker.toml"]
    assert degraded["status"] == "True"
    assert "spec.config.node.site_id is managed" in degraded["message"]
    assert "it stays 4" in message and "n_shards = 4" in config
    assert len(status_of(testbed, namespace, "odd")["placement"]["shards"]) == 4
    assert "InvalidSpec" in event_reasons(testbed, namespace, "odd")


def test_replication_factor_above_replicas_is_capped_and_said(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    """One pod with the default factor 3 is a valid start, not a problem: each shard gets
    the one replica there is room for, a condition says so, and scaling up to the factor
    clears it."""
    with operator():
        testbed.apply(cluster_manifest("small", replicas=1, durableStorage={"nShards": 4}),
                      namespace)
        capped = eventually(lambda: conditions_of(testbed, namespace, "small").get(
            "ReplicationCapped"))
        status = status_of(testbed, namespace, "small")
        degraded = conditions_of(testbed, namespace, "small")["Degraded"]
        testbed.kubectl("patch", "mqc", "small", "-n", namespace, "--type=merge",
                        "-p", '{"spec": {"replicas": 3}}')
        full = eventually(lambda: (c := conditions_of(testbed, namespace, "small")[
            "ReplicationCapped"])["status"] == "False" and c, what="factor applied")
        shards = status_of(testbed, namespace, "small")["placement"]["shards"]
        config = testbed.get("configmap", "small-config", namespace)["data"]["broker.toml"]
    assert capped["status"] == "True" and capped["reason"] == "FewerSitesThanFactor"
    assert "each shard keeps 1 replica(s) until there are 3" in capped["message"]
    assert degraded["status"] == "False", degraded
    assert status["phase"] != "Degraded"
    assert all(len(members) == 1 for members in status["placement"]["shards"].values())
    assert sts_replicas(testbed, namespace, "small") == 3
    assert full["reason"] == "FactorApplied"
    assert all(len(members) == 3 for members in shards.values())
    assert "replication_factor = 3" in config
    assert "ReplicationCapped" in event_reasons(testbed, namespace, "small")
    assert "InvalidSpec" not in event_reasons(testbed, namespace, "small")


def test_scale_3_to_5_to_2_keeps_sites_moves_little_and_drains_before_shrinking(
        testbed: Testbed, namespace: str, operator: Callable[[], Any],
        brokers: FakeBrokers) -> None:
    spec = {"durableStorage": {"nShards": 12, "replicationFactor": 2},
            "listeners": {"httpPort": brokers.port}}
    with operator():
        testbed.apply(cluster_manifest("beta", replicas=3, **spec), namespace)
        eventually(lambda: status_of(testbed, namespace, "beta").get("placement"))
        three = status_of(testbed, namespace, "beta")
        ids3 = three["siteIds"]
        config3 = testbed.get("configmap", "beta-config", namespace)["data"]

        testbed.kubectl("scale", "mqc/beta", "-n", namespace, "--replicas=5")
        eventually(lambda: sts_replicas(testbed, namespace, "beta") == 5)
        five = eventually(lambda: (s := status_of(testbed, namespace, "beta"))["placement"][
            "revision"] == 2 and s)
        ids5 = five["siteIds"]
        # Formed from three: the brokers' file (and so the pods) stays as it was.
        assert five["placement"]["bootstrapSites"] == three["placement"]["bootstrapSites"] == 3
        assert testbed.get("configmap", "beta-config", namespace)["data"] == config3
        assert {k: ids5[k] for k in ids3} == ids3  # existing pods keep their sites
        old = placement.from_data(three["placement"]["shards"])
        new = placement.from_data(five["placement"]["shards"])
        sites5 = [ids5[str(o)] for o in range(5)]
        assert new == placement.plan(old, sites5, 12, 2)  # the property-tested optimum
        loads = five["placement"]["loads"]
        assert max(loads.values()) - min(loads.values()) <= 1
        moves = placement.transitions(old, new)
        assert all(set(m.add) <= {ids5["3"], ids5["4"]} for m in moves)
        # 24 replicas on 5 sites: the old sites keep 5 of their 8 each, so 9 copies, no more
        assert sum(len(m.add) for m in moves) == 9

        for ordinal in range(5):
            pod = f"beta-{ordinal}"
            eventually(lambda p=pod: testbed.find("pod", p, namespace), what=pod)
            set_pod_ready(testbed, namespace, pod)
        leaving = [ids5["2"], ids5["3"], ids5["4"]]
        brokers.holding = {site: [0, 1] for site in leaving}  # still holding replicas

        testbed.kubectl("scale", "mqc/beta", "-n", namespace, "--replicas=2")
        draining = eventually(lambda: status_of(testbed, namespace, "beta").get("drain"))
        assert draining["sites"] == leaving and draining["reason"] == "DrainPending"
        plan = published_plan(testbed, namespace, "beta")  # the plan moved off first...
        assert plan["sites"] == [ids5["0"], ids5["1"]] and plan["leaving"] == leaving
        assert all(set(m) == {ids5["0"], ids5["1"]} for m in plan["shards"].values())
        assert sts_replicas(testbed, namespace, "beta") == 5  # ...and the pods stay meanwhile
        assert status_of(testbed, namespace, "beta")["phase"] == "Draining"
        assert set(leaving) <= brokers.asked

        brokers.holding = {}  # the brokers finished moving the replicas
        eventually(lambda: sts_replicas(testbed, namespace, "beta") == 2)
        two = eventually(lambda: (s := status_of(testbed, namespace, "beta")).get(
            "drain") is None and s)
        assert two["siteIds"] == ids5  # scaled-down ordinals keep their IDs
        assert set(two["placement"]["loads"]) == {ids5["0"], ids5["1"]}  # left sites dropped
        assert two["transitions"]  # the brokers have not reported the new replicas yet
        brokers.holding = {site: [int(s) for s, members in two["placement"]["shards"].items()
                                  if site in members] for site in (ids5["0"], ids5["1"])}
        eventually(lambda: status_of(testbed, namespace, "beta")["transitions"] == [],
                   what="transitions settled by the brokers' answers")
        assert [s["id"] for s in two["sites"]] == [ids5["0"], ids5["1"]]
        assert {"DrainStarted", "DrainPending", "DrainConfirmed", "ScaledDown"} <= set(
            eventually(lambda: event_reasons(testbed, namespace, "beta")))
        assert brokers.keys == {api_key_of(testbed, namespace, "beta")}  # every call keyed

        testbed.kubectl("scale", "mqc/beta", "-n", namespace, "--replicas=4")
        back = eventually(lambda: (s := status_of(testbed, namespace, "beta"))[
            "siteCount"] == 4 and s)
        assert back["siteIds"] == ids5  # ordinals 2 and 3 come back as the same sites
        assert sites.merge_known(testbed.get("configmap", "beta-sites", namespace)["data"],
                                 None) == sites.merge_known(ids5, None)


def test_a_spec_edited_back_while_transitions_are_pending_is_reconciled(
        testbed: Testbed, namespace: str, operator: Callable[[], Any],
        brokers: FakeBrokers) -> None:
    """Scale 3 -> 5 of answering brokers leaves transitions pending (the new sites report no
    shard yet), so the change is not finished while the operator asks again; scaling back to
    3 meanwhile returns the spec to the one last finished. With kopf retrying the change
    handler, kopf saw no change in that, and nothing ran: the StatefulSet stayed at 5."""
    spec = {"durableStorage": {"nShards": 4, "replicationFactor": 2},
            "listeners": {"httpPort": brokers.port}}

    def ready_pods(count: int) -> None:
        for ordinal in range(count):
            pod = f"eps-{ordinal}"
            eventually(lambda p=pod: testbed.find("pod", p, namespace), what=pod)
            set_pod_ready(testbed, namespace, pod)
        eventually(lambda: status_of(testbed, namespace, "eps").get("readyReplicas") == count,
                   what=f"{count} ready")

    with operator():
        testbed.apply(cluster_manifest("eps", replicas=3, **spec), namespace)
        ready_pods(3)
        testbed.kubectl("scale", "mqc/eps", "-n", namespace, "--replicas=5")
        ready_pods(5)  # the last pod event: nothing but the operator itself acts from here
        assert status_of(testbed, namespace, "eps")["transitions"]
        assert condition(testbed, namespace, "eps", "Progressing")[
            "reason"] == "TransitionsPending"
        testbed.kubectl("scale", "mqc/eps", "-n", namespace, "--replicas=3")
        eventually(lambda: sts_replicas(testbed, namespace, "eps") == 3,
                   what="the StatefulSet back at three")
    assert {"DrainStarted", "DrainConfirmed", "ScaledDown"} <= set(
        event_reasons(testbed, namespace, "eps"))


def test_a_pod_whose_volume_was_replaced_gets_a_new_site(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    """Each site is bound to its claim's UID; a lost volume (claim deleted, the StatefulSet
    makes a new one) must not come back under the old site, which brokers refuse."""

    def annotated(pod: str) -> str | None:
        found = testbed.find("pod", pod, namespace)
        return ((found or {}).get("metadata", {}).get("annotations") or {}).get(
            c.SITE_ANNOTATION)

    def claim_uid() -> str | None:
        found = testbed.find("pvc", "data-zeta-1", namespace)
        return None if found is None else str(found["metadata"]["uid"])

    with operator():
        testbed.apply(cluster_manifest("zeta", replicas=2,
                                       durableStorage={"replicationFactor": 2}), namespace)
        ids = eventually(lambda: status_of(testbed, namespace, "zeta").get("siteIds"))
        for ordinal in range(2):
            eventually(lambda o=ordinal: annotated(f"zeta-{o}") == ids[str(o)],
                       what=f"zeta-{ordinal} named its site")
        old_claim = claim_uid()
        assert testbed.get("configmap", "zeta-sites", namespace)["data"]["claim-1"] == old_claim

        testbed.kubectl("delete", "pvc", "data-zeta-1", "-n", namespace, "--wait=false")
        testbed.kubectl("delete", "pod", "zeta-1", "-n", namespace)
        new_claim = eventually(lambda: (uid := claim_uid()) not in (None, old_claim) and uid,
                               what="the StatefulSet's new claim")
        new_site = eventually(lambda: (s := status_of(testbed, namespace, "zeta")[
            "siteIds"]["1"]) != ids["1"] and s, what="a new site for ordinal 1")
        eventually(lambda: annotated("zeta-1") == new_site, what="the new pod named it")
        data = testbed.get("configmap", "zeta-sites", namespace)["data"]
        assert data == {"0": ids["0"], "1": new_site, "claim-0": data["claim-0"],
                        "claim-1": new_claim}
        assert annotated("zeta-0") == ids["0"]  # the kept volume keeps its site
        plan = eventually(lambda: (p := published_plan(testbed, namespace, "zeta"))[
            "sites"] == [ids["0"], new_site] and p, what="the plan on the new site")
        assert all(ids["1"] not in members for members in plan["shards"].values())
        # No broker answers here: the old site stays listed as leaving, so the brokers
        # remove it from every group.
        assert plan["leaving"] == [ids["1"]]
        assert status_of(testbed, namespace, "zeta")["goneSites"] == [ids["1"]]
    events = [e for e in testbed.items("events", namespace) if e["reason"] == "SiteReplaced"]
    assert len(events) == 1 and events[0]["type"] == "Warning"
    assert ids["1"] in events[0]["message"] and new_site in events[0]["message"]


def test_unreachable_brokers_are_recorded_and_the_shrink_proceeds(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    with operator():
        testbed.apply(cluster_manifest("gamma", replicas=3), namespace)
        eventually(lambda: sts_replicas(testbed, namespace, "gamma") == 3)
        testbed.kubectl("scale", "mqc/gamma", "-n", namespace, "--replicas=1")
        eventually(lambda: sts_replicas(testbed, namespace, "gamma") == 1)
        reasons = eventually(lambda: "ScaledDown" in (
            r := event_reasons(testbed, namespace, "gamma")) and r)
    assert {"DrainStarted", "DrainUnconfirmed"} <= set(reasons)
    events = [e for e in testbed.items("events", namespace) if e["reason"] == "DrainUnconfirmed"]
    assert events[0]["type"] == "Warning" and "pod has no IP" in events[0]["message"]


def test_require_drain_confirmation_waits_for_unreachable_brokers(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    with operator():
        testbed.apply(cluster_manifest("delta", replicas=2,
                                       durableStorage={"replicationFactor": 2},
                                       scaleDown={"requireDrainConfirmation": True}), namespace)
        eventually(lambda: sts_replicas(testbed, namespace, "delta") == 2)
        testbed.kubectl("scale", "mqc/delta", "-n", namespace, "--replicas=1")
        drain = eventually(lambda: status_of(testbed, namespace, "delta").get("drain"))
        assert drain["reason"] == "DrainUnconfirmed"
        eventually(lambda: "DrainUnconfirmed" in event_reasons(testbed, namespace, "delta"))
        assert sts_replicas(testbed, namespace, "delta") == 2


def test_delete_garbage_collects_every_child(
        testbed: Testbed, namespace: str, operator: Callable[[], Any]) -> None:
    with operator():
        testbed.apply(cluster_manifest("doomed", replicas=2,
                                       durableStorage={"replicationFactor": 2}), namespace)
        for kind, pattern in CHILDREN:
            eventually(lambda k=kind, p=pattern: testbed.find(k, p.format("doomed"), namespace))
        eventually(lambda: testbed.find("pod", "doomed-1", namespace))
        testbed.kubectl("delete", "mqc", "doomed", "-n", namespace)
        for kind, pattern in CHILDREN:
            eventually(lambda k=kind, p=pattern: testbed.find(
                k, p.format("doomed"), namespace) is None, what=f"{kind} collected")
        eventually(lambda: not testbed.items("pods", namespace), what="pods collected")


def snapshot(testbed: Testbed, namespace: str, name: str) -> dict[str, Any]:
    """Everything the operator owns (identity, spec/data, labels, owners, field managers:
    all but resourceVersion, which v1.20 bumps even for a no-op apply), plus its decisions."""
    children = {}
    for kind in ("configmaps", "secrets", "services", "statefulsets", "poddisruptionbudgets",
                 "servicemonitors"):
        for item in testbed.items(kind, namespace, f"app.kubernetes.io/instance={name}"):
            item["metadata"].pop("resourceVersion")
            item.pop("status", None)  # the controller-manager's, not the operator's
            children[(kind, item["metadata"]["name"])] = json.dumps(item, sort_keys=True)
    status = status_of(testbed, namespace, name)
    return {"children": children, "sites": status["siteIds"],
            "revision": status["placement"]["revision"],
            "events": len(event_reasons(testbed, namespace, name))}


def reconciles(operator_env: dict[str, str]) -> float:
    """Reconciles so far (the counters live in this process); 0 while no server listens."""
    url = f"http://127.0.0.1:{operator_env['MQTT_OPERATOR_METRICS_PORT']}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except urllib.error.URLError:
        return 0
    return sum(float(v) for v in re.findall(
        r'^mqtt_operator_reconciles_total\{[^}]*\} (\S+)', text, re.M))


def test_operator_restart_resumes_without_duplicating_anything(
        testbed: Testbed, namespace: str, operator: Callable[[], Any],
        operator_env: dict[str, str]) -> None:
    with operator():
        testbed.apply(cluster_manifest("steady", replicas=3), namespace)
        eventually(lambda: status_of(testbed, namespace, "steady").get("placement"))
        eventually(lambda: len(testbed.items("pods", namespace)) == 3, what="3 pods")
        before = snapshot(testbed, namespace, "steady")
        count = reconciles(operator_env)
    with operator() as runner:  # resumes the cluster; the initial pod listing adds 3 more
        eventually(lambda: reconciles(operator_env) >= count + 4, what="resume + pods")
        after = snapshot(testbed, namespace, "steady")
    old, new = before.pop("children"), after.pop("children")
    assert {k: (v, new.get(k)) for k, v in old.items() if new.get(k) != v} == {}
    assert new.keys() == old.keys()  # nothing written, nothing created
    assert ("secrets", "steady-cookie") in old  # the same cookie, untouched
    assert ("secrets", "steady-api-key") in old  # the same API keys, untouched
    assert after == before  # same sites, placement revision and number of events
    assert "Handler 'on_change' succeeded" in runner.output  # resumed the existing cluster
