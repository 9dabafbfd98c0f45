"""The operator's own Prometheus metrics, served on their own port (not the brokers').

Per-cluster gauges carry `mqttcluster` and `mqttcluster_namespace` rather than `namespace`:
Prometheus gives every series scraped from the operator the operator pod's own `namespace`,
which would otherwise overwrite the cluster's (the operator may watch every namespace).
"""

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()
RECONCILES = Counter("mqtt_operator_reconciles_total",
                     "Reconciles of MQTTCluster resources, by what started them",
                     ["trigger"], registry=REGISTRY)
FAILURES = Counter("mqtt_operator_reconcile_failures_total",
                   "Reconciles that raised (the API server refused or could not be reached)",
                   ["trigger"], registry=REGISTRY)
WAITING = Counter("mqtt_operator_reconcile_waits_total",
                  "Reconciles that must run again soon (a drain not yet confirmed)",
                  registry=REGISTRY)
DURATION = Histogram("mqtt_operator_reconcile_duration_seconds",
                     "Wall time of one reconcile", registry=REGISTRY,
                     buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))

_CLUSTER = ["mqttcluster_namespace", "mqttcluster"]
SPEC_REPLICAS = Gauge("mqtt_operator_cluster_spec_replicas",
                      "spec.replicas of the MQTTCluster: the brokers it should have",
                      _CLUSTER, registry=REGISTRY)
READY_REPLICAS = Gauge("mqtt_operator_cluster_ready_replicas",
                       "Broker pods among the first spec.replicas that are Ready, i.e. joined"
                       " (status.readyReplicas)", _CLUSTER, registry=REGISTRY)
TRANSITIONS = Gauge("mqtt_operator_replica_transitions_pending",
                    "Shard replica moves of the placement that the brokers have not confirmed",
                    _CLUSTER, registry=REGISTRY)
DRAINING = Gauge("mqtt_operator_drain_pending",
                 "1 while a scale down waits for the leaving sites to hand their shards over",
                 _CLUSTER, registry=REGISTRY)

BACKUP_FRESH = Gauge("mqtt_operator_backup_last_success_timestamp_seconds",
                     "When the last scheduled export succeeded (status.backups.lastSuccess),"
                     " or, before the first, when the schedule was set; absent without a"
                     " schedule or while it is suspended", _CLUSTER, registry=REGISTRY)
BACKUP_GAP = Gauge("mqtt_operator_backup_schedule_interval_seconds",
                   "The longest time between two runs of spec.backup.schedule",
                   _CLUSTER, registry=REGISTRY)

_GAUGES = (SPEC_REPLICAS, READY_REPLICAS, TRANSITIONS, DRAINING)
_BACKUP_GAUGES = (BACKUP_FRESH, BACKUP_GAP)


@dataclass(frozen=True)
class ClusterState:
    """What one reconcile saw of a cluster, for the per-cluster gauges."""

    spec_replicas: int
    ready_replicas: int
    transitions: int
    draining: bool
    backup: tuple[float, float] | None = None  # (fresh as of, schedule interval), seconds


def report(namespace: str, name: str, state: ClusterState | None) -> None:
    """Sets the cluster's gauges; None (the cluster is gone) removes them, and a cluster
    without a running backup schedule has no backup gauges."""
    values: dict[Gauge, float] = {} if state is None else dict(zip(_GAUGES, (
        state.spec_replicas, state.ready_replicas, state.transitions, int(state.draining)),
        strict=True))
    if state is not None and state.backup is not None:
        values.update(zip(_BACKUP_GAUGES, state.backup, strict=True))
    for gauge in (*_GAUGES, *_BACKUP_GAUGES):
        if gauge in values:
            gauge.labels(namespace, name).set(values[gauge])
        else:
            gauge.remove(namespace, name)  # a label set never set is no error
