"""The MQTTCluster spec as typed values, and the checks the CRD schema cannot express.

The API server applies the CRD's defaults on every read, so this reads fields without
defaults of its own: a single source of defaults (crds/mqttcluster.yaml) cannot drift.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FileSource:
    """One key of a ConfigMap or Secret that the brokers read as a file (kind: the
    volume's, `configMap` or `secret`)."""

    kind: str
    name: str
    key: str


@dataclass(frozen=True)
class Cluster:
    name: str
    namespace: str
    uid: str
    generation: int
    replicas: int
    image: str
    image_pull_policy: str
    storage_size: str
    storage_class: str | None
    durable_sessions: Mapping[str, Any]
    n_shards: int
    replication_factor: int
    service_type: str
    mqtt_port: int
    tls_port: int
    ws_port: int
    http_port: int
    rpc_port: int
    cluster_domain: str
    require_drain_confirmation: bool
    service_monitor: bool
    service_monitor_interval: str
    extra_config: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, Any] = field(default_factory=dict)
    affinity: Mapping[str, Any] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    spark: Mapping[str, Any] | None = None  # spec.spark; absent: no Spark jobs
    allow_anonymous: bool = False
    # The password file; None: the operator's generated user (<cluster>-mqtt-user)
    passwords: FileSource | None = None
    generated_user: str = "mqtt"
    acl: FileSource | None = None
    tls_secret: str | None = None  # spec.tls; None: no TLS listener
    verify_peer: bool = False
    service: Mapping[str, Any] = field(default_factory=dict)  # spec.service but its type
    backup: Mapping[str, Any] | None = None  # spec.backup; absent: no scheduled exports
    restore_from: Mapping[str, Any] | None = None  # spec.restoreFrom

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "Cluster":
        meta, spec = body["metadata"], body["spec"]
        storage, listeners = spec["storage"], spec["listeners"]
        monitor = spec["monitoring"]["serviceMonitor"]
        auth, acl, tls = spec["auth"], spec.get("acl"), spec.get("tls")
        service = dict(spec["service"])
        secret = auth.get("passwordSecret")
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            generation=int(meta.get("generation", 1)),
            replicas=spec["replicas"],
            image=spec["image"],
            image_pull_policy=spec["imagePullPolicy"],
            storage_size=storage["size"],
            storage_class=storage.get("storageClassName") or None,
            durable_sessions=dict(spec["durableSessions"]),
            n_shards=spec["durableStorage"]["nShards"],
            replication_factor=spec["durableStorage"]["replicationFactor"],
            service_type=service.pop("type", None) or listeners["serviceType"],
            mqtt_port=listeners["mqttPort"],
            tls_port=listeners["tlsPort"],
            ws_port=listeners["wsPort"],
            http_port=listeners["httpPort"],
            rpc_port=listeners["rpcPort"],
            cluster_domain=spec["clusterDomain"],
            require_drain_confirmation=spec["scaleDown"]["requireDrainConfirmation"],
            service_monitor=monitor["enabled"],
            service_monitor_interval=monitor["interval"],
            extra_config=dict(spec.get("config") or {}),
            resources=dict(spec.get("resources") or {}),
            affinity=dict(spec.get("affinity") or {}),
            tolerations=tuple(spec.get("tolerations") or ()),
            node_selector=dict(spec.get("nodeSelector") or {}),
            spark=spec.get("spark"),
            allow_anonymous=auth["allowAnonymous"],
            passwords=FileSource("secret", secret["name"], secret["key"]) if secret else None,
            generated_user=auth["generatedUser"],
            acl=None if acl is None else FileSource(
                "configMap" if "configMapName" in acl else "secret",
                acl.get("configMapName") or acl["secretName"], acl["key"]),
            tls_secret=tls["secretName"] if tls else None,
            verify_peer=bool(tls and tls["verifyPeer"]),
            service=service,
            backup=spec.get("backup"),
            restore_from=spec.get("restoreFrom"),
        )
