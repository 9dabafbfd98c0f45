"""The MQTTCluster spec as typed values, and the checks the CRD schema cannot express.

The API server applies the CRD's defaults on every read, so this reads fields without
defaults of its own: a single source of defaults (crds/mqttcluster.yaml) cannot drift.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "Cluster":
        meta, spec = body["metadata"], body["spec"]
        storage, listeners = spec["storage"], spec["listeners"]
        monitor = spec["monitoring"]["serviceMonitor"]
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
            service_type=listeners["serviceType"],
            mqtt_port=listeners["mqttPort"],
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
        )
