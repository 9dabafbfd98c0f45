"""The broker.toml the operator renders for every pod (contract v10, docs/operator-contract.md).

Only keys `broker run` accepts appear here; a test loads the rendered file with the broker's
own loader, so a renamed or removed broker key fails the build instead of a rollout. Per-pod
values (node.name, node.site_id) are not in the file: the pod's command adds them. Nor are the
cookie and the API keys: the file (a ConfigMap anyone who may read the namespace's ConfigMaps
can read) names only where the pod finds them, the mounted Secrets.
"""

import json
import math
import re
from collections.abc import Mapping

from mqtt_operator import constants
from mqtt_operator.spec import Cluster

Scalar = str | int | bool

_TLS_KEYS = ("bind", "ssl_options.certfile", "ssl_options.keyfile", "ssl_options.cacertfile",
             "ssl_options.verify", "ssl_options.fail_if_no_peer_cert")
_TLS = "listeners.ssl.default."

# Keys whose value the operator derives from the spec or the pod; spec.config cannot set them
# because a pod disagreeing with the StatefulSet, the Services or the placement breaks the
# cluster in ways no broker can detect.
MANAGED_KEYS = frozenset({
    "node.name",
    "node.site_id",
    "node.data_dir",
    "node.cookie",
    "node.cookie_file",
    "api_key.bootstrap_file",
    "cluster.name",
    "cluster.discovery_strategy",
    "cluster.k8s.service_name",
    "cluster.k8s.namespace",
    "cluster.k8s.address_type",
    "rpc.tcp_server_port",
    "rpc.listen_address",
    "listeners.tcp.default.bind",
    "listeners.ws.default.bind",
    "dashboard.listeners.http.bind",
    "durable_sessions.enable",
    "durable_sessions.batch_size",
    "durable_sessions.message_retention_period",
    "durable_sessions.session_gc_interval",
    "durable_storage.messages.backend",
    "durable_storage.messages.n_shards",
    "durable_storage.messages.replication_factor",
    "durable_storage.messages.placement_file",
    "durable_storage.n_sites",
    *(f"listeners.ssl.default.{key}" for key in _TLS_KEYS),
    "authentication.password_file",
    "authentication.allow_anonymous",
    "authorization.acl_file",
})

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
GRACEFUL_STOP_KEY = "node.graceful_stop_timeout"
GRACEFUL_STOP_DEFAULT = 5  # the broker's default, in seconds
# What a broker's stop takes after the hand-over, at most: its clients' connections closing
# (5 s), replicated writes settling (5 s), then the storage's flush, with room to spare.
STOP_FLUSH_SECONDS = 25


def discovery(cluster: Cluster) -> dict[str, Scalar]:
    """Peers from the API: the headless Service's Endpoints (EMQX's `k8s` strategy), read
    with the pods' own ServiceAccount. Not DNS, which a cluster may lack (or serve late: a
    new pod's peers would wait out negative caching). Every pod is listed, Ready or not
    (publishNotReadyAddresses), by IP (`ip`: no name to resolve) and with the port of the
    named inter-node port, so old and new pods still meet during a rollout that changes
    spec.listeners.rpcPort."""
    return {
        "cluster.discovery_strategy": "k8s",
        "cluster.k8s.service_name": constants.headless_service_name(cluster.name),
        "cluster.k8s.namespace": cluster.namespace,
        "cluster.k8s.address_type": "ip",
    }


def bootstrap_sites(replicas: int) -> int:
    """`durable_storage.n_sites` for a cluster created with `replicas` pods: every pod waits
    to see that many before the first Raft group is created, as its voters (the broker takes
    at most 5). The default 1 lets each pod whose first discovery round sees only itself
    (its peers have no IP yet) create a group of its own, and those never merge."""
    return max(1, min(replicas, constants.BOOTSTRAP_VOTER_CAP))


def security(cluster: Cluster) -> dict[str, Scalar]:
    """Who may connect, from spec.auth, spec.acl and spec.tls: only paths to the mounted
    Secrets and ConfigMaps, never what they hold. The brokers re-read each file when kubelet
    swaps in a new version, so a rotated password, ACL or certificate needs no restart.
    Without spec.tls the TLS listener stays off: the broker starts it only with a
    certificate, and no spec.config key can give it one (they are managed)."""
    values: dict[str, Scalar] = {
        "authentication.password_file": f"{constants.USERS_DIR}/{constants.PASSWORD_FILE}",
        "authentication.allow_anonymous": "true" if cluster.allow_anonymous else "false",
    }
    if cluster.acl is not None:
        values["authorization.acl_file"] = f"{constants.ACL_DIR}/{constants.ACL_FILE}"
    if cluster.tls_secret is not None:
        values.update({
            _TLS + "bind": f"0.0.0.0:{cluster.tls_port}",
            _TLS + "ssl_options.certfile": f"{constants.TLS_DIR}/{constants.TLS_CERT}",
            _TLS + "ssl_options.keyfile": f"{constants.TLS_DIR}/{constants.TLS_KEY}",
        })
    if cluster.tls_secret is not None and cluster.verify_peer:
        values.update({
            _TLS + "ssl_options.cacertfile": f"{constants.TLS_DIR}/{constants.TLS_CA}",
            _TLS + "ssl_options.verify": "verify_peer",
            _TLS + "ssl_options.fail_if_no_peer_cert": True,
        })
    return values


def settings(cluster: Cluster, n_sites: int) -> dict[str, Scalar]:
    """Dotted broker keys -> values: spec.config first, then the managed keys over it.
    `n_sites` (bootstrap_sites) stays what it was at creation: it matters only while the
    cluster forms, and a changed file rolls every pod."""
    sessions = cluster.durable_sessions
    values: dict[str, Scalar] = {
        key: value for key, value in cluster.extra_config.items() if key not in MANAGED_KEYS
    }
    values.update({
        "node.data_dir": constants.DATA_DIR,
        "node.cookie_file": f"{constants.COOKIE_DIR}/{constants.COOKIE_KEY}",
        "api_key.bootstrap_file": f"{constants.API_KEY_DIR}/{constants.API_KEYS_FILE}",
        "cluster.name": cluster.name,
        **discovery(cluster),
        "rpc.tcp_server_port": cluster.rpc_port,
        "rpc.listen_address": "0.0.0.0",
        "listeners.tcp.default.bind": f"0.0.0.0:{cluster.mqtt_port}",
        "listeners.ws.default.bind": f"0.0.0.0:{cluster.ws_port}",
        "dashboard.listeners.http.bind": f"0.0.0.0:{cluster.http_port}",
        "durable_sessions.enable": bool(sessions["enable"]),
        "durable_sessions.batch_size": int(sessions["batchSize"]),
        "durable_sessions.message_retention_period": str(sessions["messageRetentionPeriod"]),
        "durable_sessions.session_gc_interval": str(sessions["sessionGcInterval"]),
        "durable_storage.messages.backend": "builtin_raft",
        "durable_storage.messages.n_shards": cluster.n_shards,
        "durable_storage.messages.replication_factor": cluster.replication_factor,
        "durable_storage.messages.placement_file":
            f"{constants.PLACEMENT_DIR}/{constants.PLACEMENT_FILE}",
        "durable_storage.n_sites": n_sites,
        **security(cluster),
    })
    return values


def metrics_need_key(cluster: Cluster) -> bool:
    """Whether spec.config turns on the brokers' `prometheus.enable_basic_auth` (spelled as
    the broker's loader reads a true value), so that scrapers must send a key."""
    value = str(cluster.extra_config.get("prometheus.enable_basic_auth", ""))
    return value.strip().lower() in ("true", "on", "yes", "1")


def termination_grace_seconds(cluster: Cluster) -> int:
    """The pod's terminationGracePeriodSeconds: long enough for the graceful stop
    (`node.graceful_stop_timeout`, spec.config may raise it) and the flush after it, so a
    rolling update's SIGTERM is never cut short by SIGKILL while leaderships move. A value
    the broker would refuse leaves the default (the broker names the key when it starts)."""
    raw = str(cluster.extra_config.get(GRACEFUL_STOP_KEY, GRACEFUL_STOP_DEFAULT))
    match = _DURATION.match(raw)
    stop = (float(match.group(1)) * _SECONDS[(match.group(2) or "s").lower()] if match
            else GRACEFUL_STOP_DEFAULT)
    return math.ceil(stop) + STOP_FLUSH_SECONDS


def ignored_keys(cluster: Cluster) -> list[str]:
    return sorted(key for key in cluster.extra_config if key in MANAGED_KEYS)


def _key(segment: str) -> str:
    return segment if _BARE_KEY.match(segment) else json.dumps(segment)


def _value(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def render_toml(values: Mapping[str, Scalar]) -> str:
    """Nested TOML tables, sorted, so the same settings always give the same bytes (and hash)."""
    tables: dict[tuple[str, ...], list[tuple[str, Scalar]]] = {}
    for dotted, value in values.items():
        *table, leaf = dotted.split(".")
        tables.setdefault(tuple(table), []).append((leaf, value))
    lines = [f"# Rendered by mqtt-operator (contract {constants.CONTRACT_VERSION}); do not edit."]
    for table in sorted(tables):
        lines.append("")
        if table:
            lines.append("[" + ".".join(_key(segment) for segment in table) + "]")
        lines.extend(f"{_key(leaf)} = {_value(value)}" for leaf, value in sorted(tables[table]))
    return "\n".join(lines) + "\n"
