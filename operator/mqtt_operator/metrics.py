"""The operator's own Prometheus metrics, served on their own port (not the brokers')."""

from prometheus_client import CollectorRegistry, Counter, Histogram

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
