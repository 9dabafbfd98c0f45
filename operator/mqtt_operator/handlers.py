"""kopf handlers: thin entry points that run one reconcile and report it.

Change handlers react at once to spec edits (and resume after a restart); broker pod events
re-reconcile their cluster, because readiness changes without any event on the MQTTCluster,
and so do the backup and restore Jobs' pods, whose end carries their result. Both paths
share one lock per cluster, so they never interleave, and both always finish: what must be
asked again without any event (a drain not confirmed yet, replica transitions the answering
brokers have not finished, generations the brokers seal for Spark, a restore Job running, a
reconcile that failed) is scheduled on the operator's own resync thread (resync.py says why
not kopf's retries). No kopf timer or daemon on purpose: those put a finalizer on the
MQTTCluster, and `helm uninstall` removes the operator together with the cluster, which
would leave the cluster stuck in deletion.

Settings (environment): MQTT_OPERATOR_METRICS_PORT (9090; 0 disables),
MQTT_OPERATOR_METRICS_ADDR (0.0.0.0), MQTT_OPERATOR_RESYNC_SECONDS (10: longest wait before
asking the brokers again about a drain or transitions, at most 5, and before retrying a
failed reconcile), MQTT_OPERATOR_BROKER_TIMEOUT (2 seconds per call),
MQTT_OPERATOR_SPARK_POLL_SECONDS (30: how often clusters with Spark jobs are reconciled).
"""

import dataclasses
import functools
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import kopf
from prometheus_client import start_http_server

from mqtt_operator import backup, metrics, resync
from mqtt_operator import constants as c
from mqtt_operator.brokers import ask_sealed, ask_site
from mqtt_operator.kube import Kube, client_from_environment, in_cluster_server
from mqtt_operator.reconcile import reconcile

RESYNC_SECONDS = float(os.environ.get("MQTT_OPERATOR_RESYNC_SECONDS", "10"))
BROKER_TIMEOUT = float(os.environ.get("MQTT_OPERATOR_BROKER_TIMEOUT", "2"))
SPARK_POLL_SECONDS = float(os.environ.get("MQTT_OPERATOR_SPARK_POLL_SECONDS", "30"))
WAIT_SECONDS = min(RESYNC_SECONDS, 5)  # brokers finish a drain or a copy within seconds
_log = logging.getLogger(__name__)
_locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations under our group, out of the status we own.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.GROUP, key="last-handled-configuration")
    # No watching of namespaces and CRDs: that needs cluster-wide read access the operator
    # otherwise does without. The CRD exists before the operator starts (the chart's crds/).
    settings.scanning.disabled = True
    memo.kube = Kube(client_from_environment())
    memo.resync = resync.Resync(functools.partial(_again, memo))
    memo.resync.start()
    port = int(os.environ.get("MQTT_OPERATOR_METRICS_PORT", "9090"))
    memo.metrics_server = None
    if port:
        memo.metrics_server, _thread = start_http_server(
            port, os.environ.get("MQTT_OPERATOR_METRICS_ADDR", "0.0.0.0"), metrics.REGISTRY)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Same sources as the reconcile's client, read at login time (see kube.py). kopf names
    the in-cluster API server by DNS (kubernetes.default.svc); the address every pod gets in
    its environment works without cluster DNS too, as the client library's does."""
    account = kopf.login_with_service_account(**kwargs)
    server = in_cluster_server()
    if account is not None and server:
        return dataclasses.replace(account, server=server)
    return account or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
def stop(memo: kopf.Memo, **_: Any) -> None:
    memo.resync.stop()
    if memo.metrics_server is not None:
        memo.metrics_server.shutdown()
        memo.metrics_server.server_close()


def _again(memo: kopf.Memo, key: resync.Key) -> None:
    try:
        _run("resync", *key, memo, _log)
    except Exception:  # scheduled again by _run; the log says why
        _log.exception("reconciling %s/%s again failed", *key)


def _run(trigger: str, namespace: str, name: str, memo: kopf.Memo,
         logger: kopf.Logger) -> None:
    """One locked, measured reconcile, and when to run it again without an event."""

    def post(body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        (kopf.info if kind == "Normal" else kopf.warn)(body, reason=reason, message=message)
        logger.info("%s: %s", reason, message)

    ask = functools.partial(ask_site, timeout=BROKER_TIMEOUT)
    sealed = functools.partial(ask_sealed, timeout=BROKER_TIMEOUT)
    metrics.RECONCILES.labels(trigger).inc()
    key = (namespace, name)
    with _locks[key], metrics.DURATION.time():
        try:
            outcome = reconcile(memo.kube, namespace, name, post, ask, sealed)
        except Exception:
            metrics.FAILURES.labels(trigger).inc()
            memo.resync.after(key, RESYNC_SECONDS)
            raise
    metrics.report(namespace, name, outcome.state)
    if outcome.waiting:
        metrics.WAITING.inc()
    memo.resync.after(key, resync.delay(bool(outcome.waiting), outcome.polls, WAIT_SECONDS,
                                        SPARK_POLL_SECONDS))


# Failures too are retried by the resync thread, not kopf: kopf's retry stalls on a spec
# edited back meanwhile (resync.py).
@kopf.on.resume(c.GROUP, c.VERSION, c.PLURAL, errors=kopf.ErrorsMode.IGNORED)
@kopf.on.create(c.GROUP, c.VERSION, c.PLURAL, errors=kopf.ErrorsMode.IGNORED)
@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL, field="spec", errors=kopf.ErrorsMode.IGNORED)
def on_change(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    meta = body["metadata"]
    _run("change", meta["namespace"], meta["name"], memo, logger)


def _ours(value: str | None, **_: Any) -> bool:
    """Broker pods, and the backup and restore Jobs' pods (a finished one carries its
    result)."""
    return value in (c.APP_NAME, backup.APP_NAME)


@kopf.on.event("", "v1", "pods", labels={c.LABEL_NAME: _ours})
def on_pod(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    meta = body["metadata"]
    cluster = (meta.get("labels") or {}).get(c.LABEL_INSTANCE)
    if cluster:
        _run("pod", meta["namespace"], cluster, memo, logger)
