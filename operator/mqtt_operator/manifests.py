"""The children of an MQTTCluster, as plain dicts ready for server-side apply.

Pure functions of the spec (plus the replica count and config the reconcile decided), so
what the operator would create is testable without an API server and identical on every
reconcile: applying the same dict again changes nothing.
"""

import base64
import hashlib
import json
import secrets
from collections.abc import Mapping
from typing import Any

from mqtt_operator import broker_config
from mqtt_operator import constants as c
from mqtt_operator.spec import Cluster, FileSource

Manifest = dict[str, Any]

# How a pod finds its site ID: its ordinal is the suffix of its name, and the operator has
# published ordinal -> site ID in the sites ConfigMap before the pod can exist. A missing
# entry stops the container (set -e) rather than let the broker invent a random site. A
# volume that holds no site yet (new, or replacing a lost one) takes the site the operator
# bound to the pod's claim, from the pod's annotation: until the operator has written it,
# the container exits (and the kubelet starts it again, reading the annotation anew), so a
# new volume never starts under the site of the one it replaces.
POD_SCRIPT = (
    'set -eu; ordinal="${POD_NAME##*-}"; '
    'site="$(cat "$MQTT_SITES_DIR/$ordinal")"; '
    f'if [ ! -e "$MQTT_DATA_DIR/{c.SITE_ID_FILE}" ]; then '
    'site="${MQTT_VOLUME_SITE:?a new volume waits for the operator to name its site}"; fi; '
    f'exec broker run --config "$MQTT_CONFIG_DIR/{c.CONFIG_FILE}" '
    '--set "node.name=broker@$POD_NAME.$MQTT_HEADLESS_SERVICE.$POD_NAMESPACE.svc" '
    '--set "node.site_id=$site"'
)
HEADLESS_LABEL = f"{c.GROUP}/service"
_COOKIE_VOLUME = "cookie"
_API_KEY_VOLUME = "api-key"
SECRET_MODE = 0o440  # readable by the broker through the pod's fsGroup, by nobody else
# mosquitto_passwd's $7$ (PBKDF2-HMAC-SHA512) with its iteration count and salt size: a file
# the brokers, Mosquitto and `broker ctl users` all read and extend.
_PBKDF2_ITERATIONS = 101
_SALT_BYTES = 12


def owner_reference(cluster: Cluster) -> Manifest:
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": cluster.name,
            "uid": cluster.uid, "controller": True, "blockOwnerDeletion": True}


def metadata(cluster: Cluster, name: str, **extra_labels: str) -> Manifest:
    labels = {**c.selector_labels(cluster.name), c.LABEL_MANAGED_BY: c.FIELD_MANAGER,
              **extra_labels}
    return {"name": name, "namespace": cluster.namespace, "labels": labels,
            "ownerReferences": [owner_reference(cluster)]}


def config_map(cluster: Cluster, name: str, data: Mapping[str, str]) -> Manifest:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(cluster, name),
            "data": dict(data)}


def _client_ports(cluster: Cluster) -> list[tuple[str, int]]:
    tls = [(c.TLS_PORT_NAME, cluster.tls_port)] if cluster.tls_secret is not None else []
    return [(c.MQTT_PORT_NAME, cluster.mqtt_port), (c.WS_PORT_NAME, cluster.ws_port),
            (c.HTTP_PORT_NAME, cluster.http_port), *tls]


def _pod_ports(cluster: Cluster) -> list[tuple[str, int]]:
    """The client ports plus the inter-node one, which only the pods and the headless
    Service carry: clients have no business on it."""
    return [*_client_ports(cluster), (c.RPC_PORT_NAME, cluster.rpc_port)]


def _service_ports(ports: list[tuple[str, int]]) -> list[Manifest]:
    # protocol is spelled out: server-side apply keys Service ports by (port, protocol).
    return [{"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
            for name, port in ports]


def headless_service(cluster: Cluster) -> Manifest:
    """The member list: brokers find their peers in its Endpoints (broker_config.discovery),
    each on its named inter-node port, and a pod that has not joined yet is not Ready, so
    only publishNotReadyAddresses lists it (as `addresses`, and in DNS where there is DNS)."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": metadata(cluster, c.headless_service_name(cluster.name),
                              **{HEADLESS_LABEL: "headless"}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": c.selector_labels(cluster.name),
            "ports": _service_ports(_pod_ports(cluster)),
        },
    }


def client_service(cluster: Cluster, withheld: bool = False) -> Manifest:
    """spec.service's fields where the API server takes them: source ranges on a
    LoadBalancer, the traffic policy on a Service with node ports (elsewhere it refuses the
    Service; the reconcile reports such a spec instead). `withheld`: only the HTTP API's
    port, while a new cluster waits for its restore (clients would make it non-empty)."""
    meta = metadata(cluster, cluster.name)
    if cluster.service.get("annotations"):
        meta["annotations"] = dict(cluster.service["annotations"])
    ports = [(c.HTTP_PORT_NAME, cluster.http_port)] if withheld else _client_ports(cluster)
    spec: Manifest = {
        "type": cluster.service_type,
        "selector": c.selector_labels(cluster.name),
        "ports": _service_ports(ports),
    }
    ranges = cluster.service.get("loadBalancerSourceRanges")
    if ranges and cluster.service_type == "LoadBalancer":
        spec["loadBalancerSourceRanges"] = list(ranges)
    policy = cluster.service.get("externalTrafficPolicy")
    if policy and cluster.service_type != "ClusterIP":
        spec["externalTrafficPolicy"] = policy
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def service_problems(cluster: Cluster) -> list[str]:
    """spec.service fields the Service's type leaves out (see client_service)."""
    found = []
    if cluster.service.get("loadBalancerSourceRanges") and cluster.service_type != "LoadBalancer":
        found.append("spec.service.loadBalancerSourceRanges applies to type LoadBalancer only"
                     " and is ignored")
    if cluster.service.get("externalTrafficPolicy") and cluster.service_type == "ClusterIP":
        found.append("spec.service.externalTrafficPolicy applies to types NodePort and"
                     " LoadBalancer only and is ignored")
    return found


def broker_service_account(cluster: Cluster) -> Manifest:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": metadata(cluster, c.broker_account_name(cluster.name))}


def broker_role(cluster: Cluster) -> Manifest:
    """What a broker may do with the API: read its cluster's headless Service's Endpoints
    (peer discovery), nothing else; named, so not even the namespace's other Endpoints."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": metadata(cluster, c.broker_account_name(cluster.name)),
            "rules": [{"apiGroups": [""], "resources": ["endpoints"], "verbs": ["get"],
                       "resourceNames": [c.headless_service_name(cluster.name)]}]}


def broker_role_binding(cluster: Cluster) -> Manifest:
    name = c.broker_account_name(cluster.name)
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": metadata(cluster, name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name,
                          "namespace": cluster.namespace}]}


def cookie_secret(cluster: Cluster, cookie: str) -> Manifest:
    """The brokers' shared cookie, created once (never applied again: a new value would
    split the cluster between pods started before and after it). Immutable, so an edit
    cannot change it under running brokers either; deleting it is the only way to lose it."""
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": metadata(cluster, c.cookie_secret_name(cluster.name)),
            "type": "Opaque", "immutable": True, "stringData": {c.COOKIE_KEY: cookie}}


def api_key_secret(cluster: Cluster, admin: str, viewer: str) -> Manifest:
    """The brokers' API keys: the bootstrap file they read (`api_keys`: an administrator key
    for people, a viewer key for everything automated), and the viewer key again as a
    basic-auth pair, which the operator, `kubectl mqtt` and a ServiceMonitor use as is.

    Created once, never applied again (a reconcile must not rotate keys people use), but
    not immutable, unlike the cookie: a changed key splits nothing, so rotating or adding a
    key is an edit in place, which kubelet carries into the pods' files and the brokers
    re-read without a restart."""
    keys = (f"{c.ADMIN_KEY_NAME}:{admin}:administrator\n"
            f"{c.VIEWER_KEY_NAME}:{viewer}:viewer\n")
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": metadata(cluster, c.api_key_secret_name(cluster.name)),
            "type": "Opaque",
            "stringData": {c.API_KEYS_FILE: keys, c.API_KEY_USERNAME: c.VIEWER_KEY_NAME,
                           c.API_KEY_PASSWORD: viewer}}


def password_line(username: str, password: str) -> str:
    """One line of a Mosquitto password file, as `mosquitto_passwd` writes it."""
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, _PBKDF2_ITERATIONS, 64)
    encoded = (base64.b64encode(part).decode() for part in (salt, digest))
    return f"{username}:$7${_PBKDF2_ITERATIONS}${'$'.join(encoded)}\n"


def user_secret(cluster: Cluster, password: str) -> Manifest:
    """The generated MQTT user when spec.auth names no password Secret: the password file
    the brokers read, and the pair in clear for people (the chart's NOTES say how to read
    it). Created once, never applied again (a reconcile must not change a password clients
    use); not immutable: writing a new password file into it reaches the running brokers."""
    user = cluster.generated_user
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": metadata(cluster, c.user_secret_name(cluster.name)),
            "type": "Opaque",
            "stringData": {c.PASSWORD_FILE: password_line(user, password),
                           c.USER_USERNAME: user, c.USER_PASSWORD: password}}


def mounts_cookie(statefulset: Mapping[str, Any] | None) -> bool:
    """Whether this (existing) StatefulSet's pods mount the cookie Secret: once they do, a
    missing Secret was deleted, and making a new one would rotate the cookie."""
    volumes = ((statefulset or {}).get("spec", {}).get("template", {}).get("spec", {})
               .get("volumes") or [])
    return any("secret" in volume and volume["name"] == _COOKIE_VOLUME for volume in volumes)


def config_hash(config_text: str) -> str:
    return hashlib.sha256(config_text.encode()).hexdigest()[:16]


def _probe(path: str, **timing: int) -> Manifest:
    return {"httpGet": {"path": path, "port": c.HTTP_PORT_NAME}, **timing}


def _env(name: str, value: str | None = None, field: str | None = None) -> Manifest:
    if field is not None:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field}}}
    return {"name": name, "value": value}


def _config_volume(name: str, config_map_name: str) -> Manifest:
    return {"name": name, "configMap": {"name": config_map_name}}


def _projected(source: FileSource, *files: tuple[str, str]) -> Manifest:
    """The volume of a ConfigMap's or Secret's keys as fixed file names ((key, path)
    pairs). Not a subPath mount: kubelet updates a whole volume in place, a subPath never."""
    name_field = "secretName" if source.kind == "secret" else "name"
    return {source.kind: {name_field: source.name, "defaultMode": SECRET_MODE,
                          "items": [{"key": key, "path": path} for key, path in files]}}


def security_volumes(cluster: Cluster) -> list[tuple[str, str, Manifest]]:
    """(volume name, mount path, source) of the files broker_config.security names."""
    passwords = cluster.passwords or FileSource(
        "secret", c.user_secret_name(cluster.name), c.PASSWORD_FILE)
    found = [("users", c.USERS_DIR, _projected(passwords, (passwords.key, c.PASSWORD_FILE)))]
    if cluster.acl is not None:
        found.append(("acl", c.ACL_DIR, _projected(cluster.acl, (cluster.acl.key, c.ACL_FILE))))
    if cluster.tls_secret is not None:
        files = [c.TLS_CERT, c.TLS_KEY, *([c.TLS_CA] if cluster.verify_peer else [])]
        found.append(("tls", c.TLS_DIR, _projected(
            FileSource("secret", cluster.tls_secret, ""), *((f, f) for f in files))))
    return found


def statefulset(cluster: Cluster, replicas: int, config_text: str) -> Manifest:
    container: Manifest = {
        "name": "broker",
        "image": cluster.image,
        "imagePullPolicy": cluster.image_pull_policy,
        "command": ["/bin/sh", "-c", POD_SCRIPT],
        "env": [
            _env("POD_NAME", field="metadata.name"),
            _env("POD_NAMESPACE", field="metadata.namespace"),
            _env("MQTT_HEADLESS_SERVICE", c.headless_service_name(cluster.name)),
            _env("MQTT_CONFIG_DIR", c.CONFIG_DIR),
            _env("MQTT_SITES_DIR", c.SITES_DIR),
            _env("MQTT_DATA_DIR", c.DATA_DIR),
            _env("MQTT_VOLUME_SITE", field=f"metadata.annotations['{c.SITE_ANNOTATION}']"),
        ],
        "ports": [{"name": name, "containerPort": port, "protocol": "TCP"}
                  for name, port in _pod_ports(cluster)],
        # Ready = joined: a pod takes clients (and lets a rollout or a drain move on) only
        # once it has tried every peer discovery named; alive is just "answers".
        "readinessProbe": _probe(c.READY_PATH, periodSeconds=5, failureThreshold=3),
        "livenessProbe": _probe(c.STATUS_PATH, initialDelaySeconds=10, periodSeconds=10,
                                failureThreshold=6),
        "volumeMounts": [
            {"name": "data", "mountPath": c.DATA_DIR},
            {"name": "config", "mountPath": c.CONFIG_DIR, "readOnly": True},
            {"name": "sites", "mountPath": c.SITES_DIR, "readOnly": True},
            {"name": "placement", "mountPath": c.PLACEMENT_DIR, "readOnly": True},
            {"name": _COOKIE_VOLUME, "mountPath": c.COOKIE_DIR, "readOnly": True},
            {"name": _API_KEY_VOLUME, "mountPath": c.API_KEY_DIR, "readOnly": True},
            *({"name": name, "mountPath": mount, "readOnly": True}
              for name, mount, _ in security_volumes(cluster)),
        ],
    }
    if cluster.resources:
        container["resources"] = dict(cluster.resources)
    pod_spec: Manifest = {
        "serviceAccountName": c.broker_account_name(cluster.name),
        # SIGTERM starts the graceful stop (leaderships handed over, clients told 0x8B):
        # kubelet's SIGKILL must not come before it ends.
        "terminationGracePeriodSeconds": broker_config.termination_grace_seconds(cluster),
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001},
        "containers": [container],
        "volumes": [
            _config_volume("config", c.config_map_name(cluster.name)),
            _config_volume("sites", c.sites_map_name(cluster.name)),
            _config_volume("placement", c.placement_map_name(cluster.name)),
            {"name": _COOKIE_VOLUME, "secret": {"secretName": c.cookie_secret_name(cluster.name),
                                               "defaultMode": SECRET_MODE}},
            {"name": _API_KEY_VOLUME, "secret": {
                "secretName": c.api_key_secret_name(cluster.name), "defaultMode": SECRET_MODE}},
            *({"name": name, **source} for name, _, source in security_volumes(cluster)),
        ],
    }
    if cluster.affinity:
        pod_spec["affinity"] = dict(cluster.affinity)
    if cluster.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in cluster.tolerations]
    if cluster.node_selector:
        pod_spec["nodeSelector"] = dict(cluster.node_selector)
    claim_spec: Manifest = {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": cluster.storage_size}}}
    if cluster.storage_class:
        claim_spec["storageClassName"] = cluster.storage_class
    labels = c.selector_labels(cluster.name)
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": metadata(cluster, cluster.name),
        "spec": {
            "replicas": replicas,
            "serviceName": c.headless_service_name(cluster.name),
            # Brokers join by site ID, not in order; Parallel also lets a drained scale down
            # remove all leaving pods at once.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {f"{c.GROUP}/config-hash": config_hash(config_text)},
                },
                "spec": pod_spec,
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data", "labels": labels},
                                      "spec": claim_spec}],
        },
    }


def pod_disruption_budget(cluster: Cluster, api_version: str) -> Manifest:
    """One broker down at a time: a shard keeps a quorum while a node is drained."""
    return {
        "apiVersion": api_version, "kind": "PodDisruptionBudget",
        "metadata": metadata(cluster, cluster.name),
        "spec": {"maxUnavailable": 1,
                 "selector": {"matchLabels": c.selector_labels(cluster.name)}},
    }


def service_monitor(cluster: Cluster) -> Manifest:
    """Scrapes every pod through the headless Service, so each broker is its own target.
    When spec.config makes /metrics ask for a key, Prometheus sends the viewer key from the
    API key Secret; otherwise it is not referenced, since a Prometheus that may not read the
    Secret would drop the whole ServiceMonitor."""
    endpoint: Manifest = {"port": c.HTTP_PORT_NAME, "path": "/metrics",
                          "interval": cluster.service_monitor_interval}
    if broker_config.metrics_need_key(cluster):
        secret = c.api_key_secret_name(cluster.name)
        endpoint["basicAuth"] = {"username": {"name": secret, "key": c.API_KEY_USERNAME},
                                 "password": {"name": secret, "key": c.API_KEY_PASSWORD}}
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": metadata(cluster, cluster.name),
        "spec": {
            "selector": {"matchLabels": {**c.selector_labels(cluster.name),
                                         HEADLESS_LABEL: "headless"}},
            "namespaceSelector": {"matchNames": [cluster.namespace]},
            "endpoints": [endpoint],
        },
    }


def placement_document(revision: int, cluster: Cluster, sites: list[str], leaving: list[str],
                       shards: Mapping[str, list[str]],
                       transitions: list[dict[str, Any]]) -> str:
    """The placement ConfigMap's `placement.json` (its `version`: the contract's)."""
    return json.dumps({
        "version": c.CONTRACT_VERSION,
        "db": c.DB,
        "revision": revision,
        "nShards": cluster.n_shards,
        "replicationFactor": cluster.replication_factor,
        "sites": sites,
        "leaving": leaving,
        "shards": dict(shards),
        "transitions": transitions,
    }, indent=1, sort_keys=True)
