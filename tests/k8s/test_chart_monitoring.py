"""The chart's Grafana dashboard and PrometheusRule, rendered by the real helm binary.

Checked by Prometheus's own promtool (the rules load; each alert fires on the series it
watches and not on healthy or foreign ones; every dashboard query parses), by the rules of
Grafana's dashboard model that a hand-written dashboard breaks (below), and against a live
broker and the operator: every metric a panel, variable or alert names is one they export,
except those listed in EXTERNAL, which come from elsewhere.
"""

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.clients import PahoClient, unique
from tests.k8s.conftest import (
    BUILT,
    ROOT,
    VENV_BIN,
    Testbed,
    _run,
    cluster_manifest,
    eventually,
    set_pod_ready,
)
from tests.k8s.test_helm import helm
from tests.k8s_e2e.prometheus import run_prometheus
from tests.support.broker_process import BrokerProcess

CHART = ROOT / "helm" / "durable-mqtt"
DASHBOARD_FILE = CHART / "dashboards" / "durable-mqtt.json"
RULE_API = "monitoring.coreos.com/v1/PrometheusRule"

# Metrics neither the brokers nor the operator export, and who does.
EXTERNAL = {
    "up": "Prometheus itself, for every target it scrapes",
    "kubelet_volume_stats_available_bytes": "the kubelet (its /metrics), per PVC",
    "kubelet_volume_stats_capacity_bytes": "the kubelet (its /metrics), per PVC",
}

# What Grafana puts in for a dashboard's variables, for checking the queries as PromQL.
_VARIABLE_VALUES = {"__rate_interval": "5m", "namespace": "ns", "cluster": "rel", "pod": ".*"}
_BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range"}
# Grafana's own unit IDs used here; a misspelt one shows raw numbers.
_UNITS = {"none", "short", "ops", "Bps", "s", "percentunit"}
_PANEL_TYPES = {"row", "stat", "timeseries", "table", "gauge", "bargauge", "text"}


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "Debian's prometheus package (promtool) is missing: run make install"
    return path


@pytest.fixture(scope="module")
def helm_tools(tmp_path_factory: pytest.TempPathFactory) -> Testbed:
    """The test bed's helm (helm.sh: fetched once, seconds) without its API server, for the
    tests that only render the chart: `helm template` asks no cluster."""
    env = {**os.environ, "K8S_TESTBED": str(BUILT)}
    done = _run("helm.sh", env, 300)
    assert done.returncode == 0, f"helm.sh failed:\n{done.stdout}\n{done.stderr}"
    env.pop("KUBECONFIG", None)
    env["PATH"] = f"{BUILT / 'bin'}:{VENV_BIN}:{os.environ['PATH']}"
    root = tmp_path_factory.mktemp("helm")
    return Testbed(root, root / "no-kubeconfig", env)


def render(testbed: Testbed, *args: str) -> dict[str, dict[str, Any]]:
    """kind -> the one document of that kind `helm template` renders (the chart has one of
    each kind these tests look at)."""
    text = helm(testbed, "template", "rel", str(CHART), "--namespace", "ns", *args).stdout
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


# ---- PromQL: just enough of it to find the metric names an expression reads ------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "offset", "bool", "inf", "nan"}
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.S)


def metric_names(expression: str) -> set[str]:
    """Identifiers that are neither functions (followed by a parenthesis), keywords, label
    names (in matchers and groupings), strings, durations nor exponents."""
    query = _LABEL_VALUES.match(expression)
    text = query.group(1) if query else expression
    for pattern in (_STRINGS, _MATCHERS, _RANGES, _GROUPING):
        text = pattern.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        before = text[match.start() - 1] if match.start() else " "
        if (match.group() in _KEYWORDS or before.isdigit() or before == "."
                or text[match.end():].lstrip().startswith("(")):
            continue
        names.add(match.group())
    return names


def test_metric_names_are_found_and_nothing_else() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (pod, le) (rate(a_bucket{job="x", le=~"1e3"}[5m])))'
        ' > 1e3 and on (job) group_left () label_replace(b_total offset 1h, "job", "$1",'
        ' "c", "(.*)") / ignoring(le) sum(c:d) without (e)') == {"a_bucket", "b_total", "c:d"}
    assert metric_names('label_values(mqtt_cluster_joined{namespace="$ns"}, job)') == {
        "mqtt_cluster_joined"}


# ---- the rendered rules and dashboard ---------------------------------------------------

def alert_rules(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL query of the panels and of the query variables."""
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get(
        "targets", [])] + [variable["query"]["query"] for variable in dashboard[
            "templating"]["list"] if variable["type"] == "query"]


def concrete(query: str) -> str:
    """The query as Grafana sends it once its variables have values."""
    for name, value in _VARIABLE_VALUES.items():
        query = query.replace(f"${{{name}}}", value).replace(f"${name}", value)
    label_values = _LABEL_VALUES.match(query)
    return label_values.group(1) if label_values else query


def check_rules(path: Path) -> None:
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _overlaps(a: dict[str, int], b: dict[str, int]) -> bool:
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


def dashboard_problems(dashboard: dict[str, Any]) -> list[str]:
    """What Grafana's dashboard model (classic JSON, schemaVersion 39) requires and what a
    hand-edited dashboard gets wrong: a uid Grafana accepts, unique panel IDs, a 24-column
    grid without overlaps, known panel types and units, one data source variable that every
    panel and query names, unique query refIds, every variable a query uses defined (before
    the variables that use it)."""
    problems = []
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard.get("uid", "")):
        problems.append(f"uid {dashboard.get('uid')!r}")
    for key, kind in (("title", str), ("schemaVersion", int), ("panels", list),
                      ("templating", dict), ("time", dict), ("annotations", dict)):
        if not isinstance(dashboard.get(key), kind):
            problems.append(f"{key} is not a {kind.__name__}")
    variables = dashboard["templating"]["list"]
    sources = [v["name"] for v in variables if v["type"] == "datasource"]
    if [v["query"] for v in variables if v["type"] == "datasource"] != ["prometheus"]:
        problems.append("one Prometheus data source variable wanted")
    reference = {"type": "prometheus", "uid": f"${{{sources[0]}}}"} if sources else {}
    defined = set(_BUILTIN_VARIABLES)
    for variable in variables:
        used = set(re.findall(r"\$\{?(\w+)", json.dumps(variable.get("query", ""))))
        if used - defined:
            problems.append(f"variable {variable['name']} uses undefined {used - defined}")
        if variable["type"] == "query" and variable["datasource"] != reference:
            problems.append(f"variable {variable['name']}: data source")
        defined.add(variable["name"])
    ids = [panel["id"] for panel in dashboard["panels"]]
    if len(set(ids)) != len(ids):
        problems.append(f"duplicate panel ids in {ids}")
    placed: list[tuple[str, dict[str, int]]] = []
    for panel in dashboard["panels"]:
        title, grid = panel.get("title", "?"), panel["gridPos"]
        if panel["type"] not in _PANEL_TYPES:
            problems.append(f"{title}: panel type {panel['type']}")
        if not (grid["w"] >= 1 and grid["h"] >= 1 and grid["x"] >= 0
                and grid["x"] + grid["w"] <= 24):
            problems.append(f"{title}: gridPos {grid}")
        problems += [f"{title} overlaps {other}" for other, box in placed
                     if _overlaps(grid, box)]
        placed.append((title, grid))
        if panel["type"] == "row":
            continue
        targets = panel.get("targets") or []
        if not targets or panel.get("datasource") != reference or any(
                t.get("datasource") != reference for t in targets):
            problems.append(f"{title}: no targets, or not on the data source variable")
        if len({t["refId"] for t in targets}) != len(targets):
            problems.append(f"{title}: duplicate refIds")
        if panel["fieldConfig"]["defaults"].get("unit") not in _UNITS:
            problems.append(f"{title}: unit {panel['fieldConfig']['defaults'].get('unit')}")
        used = set(re.findall(r"\$\{?(\w+)", json.dumps(targets)))
        if used - defined:
            problems.append(f"{title}: undefined variables {used - defined}")
    return problems


def test_dashboard_configmap_and_rules_render_and_are_valid(
        helm_tools: Testbed, tmp_path: Path) -> None:
    testbed = helm_tools
    plain = render(testbed)
    assert "PrometheusRule" not in plain  # no such kind served: nothing Prometheus cannot read
    config_map = plain["ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "ns"
    dashboard = json.loads(config_map["data"]["durable-mqtt.json"])
    assert dashboard == json.loads(DASHBOARD_FILE.read_text())
    assert dashboard_problems(dashboard) == []
    queries = tmp_path / "dashboard-queries.yaml"  # promtool parses rules: one per query
    queries.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{n}", "expr": concrete(query)}
        for n, query in enumerate(dashboard_queries(dashboard))]}]}))
    check_rules(queries)

    rendered = render(testbed, "--api-versions", RULE_API,
                      "--set", "prometheusRule.labels.release=kube-prometheus-stack")
    rule = rendered["PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    check_rules(rules)
    assert {r["alert"] for r in alert_rules(rule)} == set(ALERT_CASES)
    assert all(r["labels"]["severity"] in ("warning", "critical")
               and r["annotations"]["summary"] for r in alert_rules(rule))

    off = render(testbed, "--api-versions", RULE_API, "--set", "prometheusRule.enabled=false",
                 "--set", "grafanaDashboard.enabled=false")
    assert "PrometheusRule" not in off and "ConfigMap" not in off
    elsewhere = render(testbed, "--set", "grafanaDashboard.namespace=monitoring",
                       "--set", "grafanaDashboard.labels.grafana_dashboard=mqtt")
    assert elsewhere["ConfigMap"]["metadata"]["namespace"] == "monitoring"
    assert elsewhere["ConfigMap"]["metadata"]["labels"]["grafana_dashboard"] == "mqtt"


# ---- the alerts, fed series by promtool's rule unit tests ---------------------------------

_B = {"namespace": "ns", "job": "rel-headless"}
_OP = {"namespace": "ns", "job": "rel-operator-metrics"}
_MQC = {**_OP, "mqttcluster_namespace": "ns", "mqttcluster": "rel"}


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ", ".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _bucket(name: str, pod: str, counts: dict[str, int]) -> list[dict[str, str]]:
    """A histogram's buckets, each growing by its count a minute."""
    return [_series(f"{name}_bucket", {**_B, "pod": pod, "le": le}, f"0+{count}x40")
            for le, count in counts.items()]


def _shared_group(group: str, topic_filter: str, backlog: dict[str, str],
                  connected: dict[str, str] | None = None) -> list[dict[str, str]]:
    """A durable shared group's gauges per pod: backlog, and members by state."""
    labels = {**_B, "group": group, "filter": topic_filter}
    return [*(_series("mqtt_shared_group_backlog", {**labels, "pod": pod}, values)
              for pod, values in backlog.items()),
            *(_series("mqtt_shared_group_members",
                      {**labels, "pod": pod, "state": "connected"}, values)
              for pod, values in (connected or {}).items()),
            *(_series("mqtt_shared_group_members",
                      {**labels, "pod": pod, "state": "disconnected"}, "2x40")
              for pod in (connected or {}))]


SERIES = [
    _series("up", {**_B, "pod": "rel-0"}, "1x40"),
    _series("up", {**_B, "pod": "rel-1"}, "1 1 0x38"),
    _series("up", {**_OP, "pod": "op"}, "1x40"),
    _series("mqtt_cluster_joined", {**_B, "pod": "rel-0"}, "1x40"),
    _series("mqtt_cluster_joined", {**_B, "pod": "rel-2"}, "0x40"),
    _series("mqtt_operator_cluster_spec_replicas", _MQC, "3x40"),
    _series("mqtt_operator_cluster_ready_replicas", _MQC, "2x40"),
    _series("mqtt_cluster_members", {**_B, "pod": "rel-0", "status": "running"}, "3x40"),
    _series("mqtt_cluster_members", {**_B, "pod": "rel-2", "status": "running"}, "1x40"),
    _series("mqtt_durable_write_errors_total", {**_B, "pod": "rel-0"}, "0x10 1x30"),
    _series("mqtt_alarm_active", {**_B, "pod": "rel-0", "alarm": "disk_full"}, "0x5 1x35"),
    _series("mqtt_alarm_active", {**_B, "pod": "rel-1", "alarm": "disk_full"}, "0x40"),
    _series("mqtt_alarm_active", {**_B, "pod": "rel-0", "alarm": "db_storage_quota_exceeded"},
            "0x40"),
    _series("mqtt_alarm_active", {**_B, "pod": "rel-1", "alarm": "db_storage_quota_exceeded"},
            "0x2 1x38"),
    *_bucket("mqtt_durable_write_seconds", "rel-0", {"0.5": 10, "1.0": 10, "+Inf": 100}),
    *_bucket("raft_wal_fsync_seconds", "rel-0", {"0.005": 100, "+Inf": 100}),
    _series("kubelet_volume_stats_available_bytes",
            {"namespace": "ns", "persistentvolumeclaim": "data-rel-0"}, "5x40"),
    _series("kubelet_volume_stats_capacity_bytes",
            {"namespace": "ns", "persistentvolumeclaim": "data-rel-0"}, "100x40"),
    _series("kubelet_volume_stats_available_bytes",  # another app's claim: not ours
            {"namespace": "ns", "persistentvolumeclaim": "data-other-0"}, "5x40"),
    _series("kubelet_volume_stats_capacity_bytes",
            {"namespace": "ns", "persistentvolumeclaim": "data-other-0"}, "100x40"),
    _series("mqtt_durable_checkpoint_lag", {**_B, "pod": "rel-0"}, "0+1000x40"),
    _series("mqtt_durable_checkpoint_lag", {**_B, "pod": "rel-1"}, "20000x40"),  # not growing
    _series("mqtt_operator_reconcile_failures_total", {**_OP, "trigger": "pod"}, "0+1x40"),
    _series("mqtt_operator_replica_transitions_pending", _MQC, "0x4 2x36"),
    _series("mqtt_operator_drain_pending", _MQC, "1x40"),
    # Exports every 10 minutes, none since the start (epoch 0): over 2 gaps from minute 20.
    _series("mqtt_operator_backup_last_success_timestamp_seconds", _MQC, "0x40"),
    _series("mqtt_operator_backup_schedule_interval_seconds", _MQC, "600x40"),
    _series("mqtt_operator_backup_last_success_timestamp_seconds",  # another cluster's
            {**_OP, "mqttcluster_namespace": "ns", "mqttcluster": "other"}, "0x40"),
    _series("mqtt_operator_backup_schedule_interval_seconds",
            {**_OP, "mqttcluster_namespace": "ns", "mqttcluster": "other"}, "600x40"),
    # Durable shared groups, as every broker exports them (each pod its series).
    *_shared_group("workers", "jobs/#", {"rel-0": "0+5x40", "rel-1": "0+5x40"},
                   connected={"rel-0": "0x40", "rel-1": "0x40"}),  # no one reads: fires
    *_shared_group("gone", "gone/#", {"rel-0": "0+1x40"}),  # no member series at all: fires
    *_shared_group("alerts", "sensors/+/alarm", {"rel-0": "0+5x40", "rel-1": "0+5x40"},
                   connected={"rel-0": "0x40", "rel-1": "1x40"}),  # one reads, on rel-1
    *_shared_group("idle", "idle/#", {"rel-0": "50x40"},
                   connected={"rel-0": "0x40"}),  # nothing new piles up
    *_shared_group("later", "later/#", {"rel-0": "0+5x40"},
                   connected={"rel-0": "1x12 0x28"}),  # unread from minute 13: not 10m yet
    _series("mqtt_shared_group_backlog",  # another release's group: not ours
            {"namespace": "ns", "job": "other-headless", "pod": "other-0", "group": "workers",
             "filter": "jobs/#"}, "0+5x40"),
]

# alert -> (minute to evaluate at, the labels of each instance expected to fire then)
ALERT_CASES: dict[str, tuple[int, list[dict[str, str]]]] = {
    "MQTTBrokerDown": (10, [{**_B, "pod": "rel-1", "severity": "critical"}]),
    "MQTTBrokerNotJoined": (10, [{**_B, "pod": "rel-2", "severity": "warning"}]),
    "MQTTClusterBelowSpecReplicas": (15, [{**_MQC, "severity": "warning"}]),
    "MQTTClusterMembersBelowSpecReplicas": (15, [{**_B, "severity": "warning"}]),
    "MQTTDurableStorageWriteErrors": (12, [{**_B, "pod": "rel-0", "severity": "critical"}]),
    "MQTTDiskFull": (10, [{**_B, "pod": "rel-0", "alarm": "disk_full",
                           "severity": "critical"}]),
    "MQTTStorageQuotaExceeded": (10, [{**_B, "pod": "rel-1",
                                       "alarm": "db_storage_quota_exceeded",
                                       "severity": "warning"}]),
    "MQTTDurableStorageWriteLatencyHigh": (15, [
        {"namespace": "ns", "pod": "rel-0", "severity": "warning"}]),
    "MQTTRaftWalFsyncSlow": (15, []),
    "MQTTDataVolumeNearlyFull": (10, [
        {"namespace": "ns", "persistentvolumeclaim": "data-rel-0", "severity": "warning"}]),
    "MQTTDurableCheckpointLagGrowing": (30, [{**_B, "pod": "rel-0", "severity": "warning"}]),
    "MQTTOperatorDown": (10, []),
    "MQTTOperatorReconcileErrors": (25, [{**_OP, "trigger": "pod", "severity": "warning"}]),
    "MQTTReplicaTransitionsStuck": (38, [{**_MQC, "severity": "warning"}]),
    "MQTTDrainStuck": (38, [{**_MQC, "severity": "warning"}]),
    "MQTTBackupTooOld": (26, [{**_MQC, "severity": "warning"}]),
    "MQTTSharedGroupBacklogWithoutConsumers": (15, [
        {**_B, "group": "workers", "filter": "jobs/#", "severity": "warning"},
        {**_B, "group": "gone", "filter": "gone/#", "severity": "warning"}]),
}


def test_alerts_fire_on_what_they_watch_and_only_there(helm_tools: Testbed,
                                                       tmp_path: Path) -> None:
    rule = render(helm_tools, "--api-versions", RULE_API)["PrometheusRule"]
    for each in alert_rules(rule):  # promtool would compare their texts too: labels suffice
        del each["annotations"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    cases = [{"eval_time": f"{minute}m", "alertname": name,
              "exp_alerts": [{"exp_labels": labels} for labels in firing]}
             for name, (minute, firing) in ALERT_CASES.items()]
    # Healthy at first: nothing has had time to fire.
    cases += [{"eval_time": "1m", "alertname": name, "exp_alerts": []} for name in ALERT_CASES]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": SERIES, "alert_rule_test": cases}]}))
    done = subprocess.run([promtool(), "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


SHARED_ALERT = "MQTTSharedGroupBacklogWithoutConsumers"


def test_shared_group_alert_is_a_toggle_with_its_own_window(helm_tools: Testbed,
                                                            tmp_path: Path) -> None:
    def alerts(*args: str) -> dict[str, dict[str, Any]]:
        rule = render(helm_tools, "--api-versions", RULE_API, *args)["PrometheusRule"]
        return {r["alert"]: r for r in alert_rules(rule)}

    default = alerts()[SHARED_ALERT]
    assert default["for"] == "10m" and "[10m]" in default["expr"]
    assert 'state="connected"' in default["expr"]
    assert 'job="rel-headless"' in default["expr"]  # the chart's cluster only
    assert {"{{ $labels.group }}", "{{ $labels.filter }}"} <= set(re.findall(
        r"\{\{ \$labels\.\w+ \}\}", default["annotations"]["summary"]))

    off = alerts("--set", "prometheusRule.sharedGroupBacklog.enabled=false")
    assert set(off) == set(ALERT_CASES) - {SHARED_ALERT}

    longer = render(helm_tools, "--api-versions", RULE_API,
                    "--set", "prometheusRule.sharedGroupBacklog.for=30m")["PrometheusRule"]
    rule = next(r for r in alert_rules(longer) if r["alert"] == SHARED_ALERT)
    assert rule["for"] == "30m" and "[30m]" in rule["expr"] and "[10m]" not in rule["expr"]
    assert "30m" in rule["annotations"]["description"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(longer["spec"]))
    check_rules(tmp_path / "rules.yaml")

    refused = helm(helm_tools, "template", "rel", str(CHART), "--api-versions", RULE_API,
                   "--set", "prometheusRule.sharedGroupBacklog.for=ten", check=False)
    assert refused.returncode != 0 and "sharedGroupBacklog" in refused.stderr


@contextmanager
def rules_prometheus(spec: dict[str, Any], broker: BrokerProcess, workdir: Path
                     ) -> Iterator[int]:
    """Debian's Prometheus evaluating the rendered rules every second over one broker,
    scraped every second as the chart's ServiceMonitor labels it (job rel-headless,
    namespace ns); yields its port."""
    (workdir / "rules.yaml").write_text(yaml.safe_dump(spec))
    with run_prometheus({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(workdir / "rules.yaml")],
        "scrape_configs": [{"job_name": "rel-headless", "static_configs": [{
            "targets": [f"127.0.0.1:{broker.ports['http']}"],
            "labels": {"namespace": "ns", "pod": "rel-0"}}]}]}, workdir) as port:
        yield port


def _alerts(port: int, name: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=10) as answer:
        return [a for a in json.load(answer)["data"]["alerts"] if a["labels"]["alertname"] == name]


@pytest.mark.integration
def test_shared_group_alert_on_a_live_broker_in_real_prometheus(
        helm_tools: Testbed, start_broker: Callable[..., BrokerProcess], tmp_path: Path,
        clients: list[PahoClient]) -> None:
    """The rule as rendered (with a 10 s window) over what a real broker exports: a durable
    shared group whose two members left while jobs keep coming fires; one member back, the
    alert is gone. Checks the metric and label names the rule assumes, not only its logic."""
    spec = render(helm_tools, "--api-versions", RULE_API,
                  "--set", "prometheusRule.sharedGroupBacklog.for=10s")["PrometheusRule"]["spec"]
    broker = start_broker(**{"durable_storage.messages.backend": "builtin_raft"})
    members = [unique("w1"), unique("w2")]
    for client_id in members:
        member = PahoClient(broker.tcp, client_id)
        clients.append(member)
        member.connect(session_expiry=3600)
        assert member.subscribe("$share/workers/jobs/#", 1) == [1]
        member.disconnect()
    publisher = PahoClient(broker.tcp, unique("pub"))
    clients.append(publisher)
    publisher.connect()

    def firing(port: int) -> list[dict[str, str]]:
        return [a["labels"] for a in _alerts(port, SHARED_ALERT) if a["state"] == "firing"]

    with rules_prometheus(spec, broker, tmp_path) as port:
        deadline, n = time.monotonic() + 60, 0
        while not firing(port):  # a job every half second: the backlog keeps growing
            assert time.monotonic() < deadline, f"never fired: {_alerts(port, SHARED_ALERT)}"
            publisher.publish(f"jobs/{n}", b"job", qos=1)
            n += 1
            time.sleep(0.5)
        assert firing(port) == [{"alertname": SHARED_ALERT, "severity": "warning",
                                 "namespace": "ns", "job": "rel-headless",
                                 "group": "workers", "filter": "jobs/#"}]
        back = PahoClient(broker.tcp, members[0])
        clients.append(back)
        back.connect(clean_start=False, session_expiry=3600)  # its session: still a member
        publisher.publish("jobs/after", b"job", qos=1)
        deadline = time.monotonic() + 30
        while _alerts(port, SHARED_ALERT):
            assert time.monotonic() < deadline, f"still on: {_alerts(port, SHARED_ALERT)}"
            time.sleep(0.5)


# ---- against what a live broker and the operator export ----------------------------------

def _exported(url: str) -> set[str]:
    """Sample names, and families declared without samples yet (a counter by label that
    has counted nothing), with a histogram's series names."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names |= {name, *((f"{name}_bucket", f"{name}_sum", f"{name}_count")
                              if kind == "histogram" else ())}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def _operator_gauge(url: str, name: str, cluster: str) -> float | None:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = re.search(rf'^{name}{{[^}}]*mqttcluster="{cluster}"[^}}]*}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


@pytest.fixture
def pod_like_broker(start_broker: Callable[..., BrokerProcess]) -> Iterator[BrokerProcess]:
    """A broker configured as the operator configures pods (replicated Durable Storage)."""
    yield start_broker(**{"durable_storage.messages.backend": "builtin_raft"})


def test_every_metric_a_panel_or_alert_uses_is_exported(
        testbed: Testbed, namespace: str, operator: Callable[[], Any],
        operator_env: dict[str, str], pod_like_broker: BrokerProcess) -> None:
    rendered = render(testbed, "--api-versions", RULE_API)
    used = {name: origin for origin, queries in (
        ("panel", dashboard_queries(json.loads(rendered["ConfigMap"]["data"][
            "durable-mqtt.json"]))),
        ("alert", [r["expr"] for r in alert_rules(rendered["PrometheusRule"])]))
        for query in queries for name in metric_names(query)}
    assert set(EXTERNAL) <= set(used), "an external metric no longer used: drop it"
    url = f"http://127.0.0.1:{operator_env['MQTT_OPERATOR_METRICS_PORT']}/metrics"
    with operator():
        testbed.apply(cluster_manifest("web", replicas=2, scaleDown={
            "requireDrainConfirmation": True}), namespace)
        eventually(lambda: testbed.find("pod", "web-1", namespace), what="pod web-1")
        set_pod_ready(testbed, namespace, "web-1")
        eventually(lambda: _operator_gauge(url, "mqtt_operator_cluster_ready_replicas",
                                           "web") == 1, what="one ready replica counted")
        broker = _exported(f"http://127.0.0.1:{pod_like_broker.ports['http']}/metrics")
        operator_names = _exported(url)
        missing = {name: origin for name, origin in used.items()
                   if name not in broker | operator_names | set(EXTERNAL)}
        assert missing == {}, f"used but exported by no one: {missing}"
        assert _operator_gauge(url, "mqtt_operator_cluster_spec_replicas", "web") == 2
        # Scaling down waits for the leaving broker (none answers) to hand its shards over.
        testbed.kubectl("patch", "mqc", "web", "-n", namespace, "--type=merge",
                        "-p", '{"spec": {"replicas": 1}}')
        eventually(lambda: _operator_gauge(url, "mqtt_operator_drain_pending", "web") == 1,
                   what="the drain counted")
        assert (_operator_gauge(url, "mqtt_operator_replica_transitions_pending", "web")
                or 0) > 0
        testbed.kubectl("delete", "mqc", "web", "-n", namespace)
        eventually(lambda: _operator_gauge(url, "mqtt_operator_cluster_spec_replicas",
                                           "web") is None, what="a deleted cluster's gauges gone")
