"""One reconcile of an MQTTCluster: read what exists, decide with the pure modules, apply.

Level-based and idempotent: every decision is re-derived from the API server (site IDs from
the sites ConfigMap, the previous plan from the placement ConfigMap, the current size from
the StatefulSet), never from memory or a possibly stale event body, so a restarted operator
continues exactly where the last one stopped.
"""

import base64
import binascii
import dataclasses
import functools
import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mqtt_operator import backup as b
from mqtt_operator import (
    broker_config,
    manifests,
    placement,
    reconcile_backup,
    references,
    sites,
    spark,
    sparkapp,
    status,
)
from mqtt_operator import constants as c
from mqtt_operator.brokers import Credentials, SiteReport, drain_verdict, settled, still_held
from mqtt_operator.kube import Kube, path
from mqtt_operator.metrics import ClusterState
from mqtt_operator.spec import Cluster

# (the MQTTCluster, Normal | Warning, reason, message) -> an Event about it
Post = Callable[[Mapping[str, Any], str, str, str], None]
# (pod IP, HTTP port, site, API key) -> report
Ask = Callable[[str | None, int, str, Credentials], SiteReport]
# (pod IP, HTTP port, API key) -> sealed (shard, generation) pairs, None when the broker
# cannot answer
AskSealed = Callable[[str | None, int, Credentials], frozenset[tuple[int, int]] | None]


@dataclass(frozen=True)
class Outcome:
    waiting: str  # why the reconcile must run again soon; empty when settled
    polls: bool = False  # Spark jobs: brokers seal generations without any Kubernetes event
    state: ClusterState | None = None  # for the operator's gauges; None: the cluster is gone


def problems(cluster: Cluster) -> list[str]:
    """What the CRD schema cannot reject (cross-field rules), each naming its field."""
    return [*(f"spec.config.{key} is managed by the operator and ignored"
              for key in broker_config.ignored_keys(cluster)),
            *manifests.service_problems(cluster)]


def _changed(conditions: Sequence[Mapping[str, Any]], new: Mapping[str, Any]) -> bool:
    """Whether a condition's message differs from last time: one Event per news, not per
    reconcile."""
    return new["message"] != next(
        (old.get("message") for old in conditions if old.get("type") == new["type"]), None)


def _data(config_map: Mapping[str, Any] | None) -> dict[str, str] | None:
    return None if config_map is None else dict(config_map.get("data") or {})


def reconcile_spark(kube: Kube, cluster: Cluster, settings: spark.Settings,
                    previous: Mapping[str, Any], pods: Mapping[int, status.PodView],
                    replicas: Mapping[int, list[int]], emit: Callable[[str, str, str], None],
                    ask: AskSealed, credentials: Credentials
                    ) -> tuple[dict[str, Any], bool, str, str]:
    """Launches what the brokers sealed, deletes what retention drops, reads the states.

    Returns (status.spark, ok, reason, message) for the SparkJobs condition. Applications
    that exist are never applied again: the Spark operator resubmits an application whose
    spec changes, and a finished run must stay finished."""
    if not kube.served(sparkapp.API_VERSION):
        return dict(previous), False, "SparkOperatorMissing", (
            f"{sparkapp.API_VERSION} is not served: install the Spark operator; no"
            f" SparkApplication is created until then")
    ns = cluster.namespace
    listed = kube.list(sparkapp.API_VERSION, sparkapp.KIND, ns, {
        c.LABEL_INSTANCE: cluster.name, sparkapp.LABEL_COMPONENT: sparkapp.COMPONENT})
    apps = [spark.AppView.from_object(app) for app in listed]
    marks = spark.watermarks(previous.get("launched") or {}, apps)
    asked = {ordinal: ask(pod.ip, cluster.http_port, credentials)
             for ordinal, pod in pods.items()
             if ordinal < cluster.replicas and pod.ready}
    answers = {ordinal: held for ordinal, held in asked.items() if held is not None}
    todo = spark.planned(settings, spark.sources(answers, replicas), marks, time.time(),
                         apps)
    owner = manifests.owner_reference(cluster)
    created = [spark.AppView.from_object(kube.apply(sparkapp.spark_application(
        cluster=cluster.name, namespace=ns, owner=owner, job=plan.job, run=plan.run,
        broker_pod=f"{cluster.name}-{plan.ordinal}",
        data_claim=c.data_claim_name(cluster.name, plan.ordinal), spec=settings.app)))
        for plan in todo]
    if created:
        emit("Normal", "SparkApplicationsCreated", ", ".join(app.name for app in created))
    apps += created
    old = spark.expired(apps, settings.keep_finished)
    for name in old:
        kube.delete(path(sparkapp.API_VERSION, sparkapp.KIND, ns, name))
    if old:
        emit("Normal", "SparkApplicationsDeleted",
             f"finished beyond the newest {settings.keep_finished} per job: {', '.join(old)}")
    kept = [app for app in apps if app.name not in old]
    silent = ", ".join(f"{cluster.name}-{o}" for o in sorted(set(asked) - set(answers)))
    message = (f"{len(kept)} application(s); {len(answers)}/{len(asked)} ready broker(s)"
               f" told their sealed generations" + (f" (not {silent})" if silent else ""))
    summary = {**spark.summary(kept), "launched": spark.launched(marks, todo)}
    return summary, True, "Launching", message


def ensure_cookie(kube: Kube, cluster: Cluster, statefulset: Mapping[str, Any] | None,
                  emit: Callable[[str, str, str], None]) -> str:
    """Creates the cookie Secret before any pod mounts it, and never again: a Secret that
    pods already mount and that is gone was deleted, and a new random one would split the
    brokers started before and after it. Returns why that happened ("" when all is well)."""
    secret = manifests.cookie_secret(cluster, secrets.token_hex(32))
    secret_name = c.cookie_secret_name(cluster.name)
    if manifests.mounts_cookie(statefulset):
        if not kube.create(secret, dry_run=True):
            return ""
        return (f"Secret {secret_name} (the brokers' cookie) was deleted: running brokers keep"
                f" the old cookie, restarted ones cannot start; recreate it with the old value,"
                f" or with a new one and then restart every broker pod")
    if kube.create(secret):
        emit("Normal", "CookieCreated", f"Secret {secret_name}: the brokers' shared cookie")
    return ""


def ensure_user(kube: Kube, cluster: Cluster, emit: Callable[[str, str, str], None]) -> None:
    """The generated MQTT user's Secret, before the StatefulSet that mounts it, when
    spec.auth names no password file of the user's own; created once, so a reconcile never
    changes a password in use. The Event names the Secret, never the password."""
    if cluster.passwords is None and kube.create(
            manifests.user_secret(cluster, secrets.token_urlsafe(18))):
        emit("Normal", "UserCreated", f"Secret {c.user_secret_name(cluster.name)}: MQTT user"
             f" {cluster.generated_user} (password under key {c.USER_PASSWORD})")


def ensure_api_key(kube: Kube, cluster: Cluster, emit: Callable[[str, str, str], None]
                   ) -> tuple[Credentials, str]:
    """The viewer key the operator asks the brokers with, from the API key Secret, made when
    there is none (before the StatefulSet that mounts it). Read on every reconcile, so a key
    rotated by editing the Secret is used at once. Returns (key, "") or (None, what is wrong
    with a Secret someone else made)."""
    name = c.api_key_secret_name(cluster.name)
    url = path("v1", "Secret", cluster.namespace, name)
    secret = kube.get(url)
    if secret is None:
        made = manifests.api_key_secret(cluster, secrets.token_hex(32), secrets.token_hex(32))
        if kube.create(made):
            emit("Normal", "ApiKeyCreated", f"Secret {name}: the brokers' API keys"
                 f" ({c.ADMIN_KEY_NAME}: administrator, {c.VIEWER_KEY_NAME}: viewer)")
        secret = kube.get(url) or {}  # ours, or one made meanwhile by someone else
    data = secret.get("data") or {}
    try:
        username, password = (base64.b64decode(data[key], validate=True).decode()
                              for key in (c.API_KEY_USERNAME, c.API_KEY_PASSWORD))
    except (KeyError, binascii.Error, UnicodeDecodeError):
        return None, (f"Secret {name} has no `{c.API_KEY_USERNAME}` and `{c.API_KEY_PASSWORD}`"
                      f" (a key the brokers know, which the operator asks them with):"
                      f" brokers refuse the operator, drains go unconfirmed")
    return (username, password), ""


def reconcile(kube: Kube, namespace: str, name: str, post: Post, ask: Ask,
              ask_sealed: AskSealed) -> Outcome:
    body = kube.get(path(c.API_VERSION, c.KIND, namespace, name))
    if body is None or body["metadata"].get("deletionTimestamp"):
        return Outcome("")  # the garbage collector removes the children
    return _Pass(kube, body, functools.partial(post, body), ask, ask_sealed).run()


@dataclass
class _Placement:
    staying: list[str]  # sites of the ordinals below spec.replicas
    leaving: list[str]  # sites of the ordinals being scaled away
    shards: placement.Placement
    revision: int
    pending: list[dict[str, Any]]  # transitions the brokers have not settled


class _Pass:
    """One reconcile, as the steps `run` takes in order. An object, so that what every step
    reads (the spec, the previous status, the StatefulSet's size, the pods, the brokers'
    answers, asked once per site) is read once and named once."""

    def __init__(self, kube: Kube, body: Mapping[str, Any], emit: Callable[[str, str, str], None],
                 ask: Ask, ask_sealed: AskSealed) -> None:
        self.kube, self.emit, self.ask, self.ask_sealed = kube, emit, ask, ask_sealed
        self.requested = Cluster.from_body(body)
        self.previous: Mapping[str, Any] = body.get("status") or {}
        self.conditions: Sequence[Mapping[str, Any]] = self.previous.get("conditions") or []
        placed = self.previous.get("placement") or {}
        self.created_shards = placed.get("nShards", self.requested.n_shards)
        self.bootstrap_sites: int = placed.get(
            "bootstrapSites", broker_config.bootstrap_sites(self.requested.replicas))
        # The brokers fix n_shards when the database is created: keep it, report the edit.
        self.cluster = dataclasses.replace(self.requested, n_shards=self.created_shards)
        self.now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace, name = self.cluster.namespace, self.cluster.name
        self.statefulset = kube.get(path("apps/v1", "StatefulSet", namespace, name))
        self.current: int = self.statefulset["spec"]["replicas"] if self.statefulset else 0
        self.pods: dict[int, status.PodView] = {}
        self.ids: dict[int, str] = {}
        self.claims: dict[int, str] = {}  # ordinal -> UID of its claim as it exists now
        # Sites gone with their volumes, listed as leaving until no group holds them.
        self.gone: list[str] = list(self.previous.get("goneSites") or [])
        self.credentials: Credentials = None
        self.reports: dict[str, SiteReport] = {}
        self.lost_secrets: list[tuple[str, str]] = []  # (condition reason, what is wrong)
        self.missing: list[tuple[str, str]] = []  # of them, objects the spec names
        self.spark_status: dict[str, Any] | None = None  # null: no Spark section, none in status
        self.backup: reconcile_backup.BackupOutcome | None = None
        self.restore: dict[str, Any] | None = None  # status.restore
        self.restoring = False  # the restore Job runs: ask again soon
        self.data_problems: list[str] = []  # spec.backup and spec.restoreFrom ignored

    def run(self) -> Outcome:
        self.ids = self.assign_sites()
        config_text = self.apply_children()
        pods = self.kube.list("v1", "Pod", self.cluster.namespace,
                              c.selector_labels(self.cluster.name))
        self.name_pod_sites(status.by_ordinal(pods, self.cluster.name))
        self.pods = status.pod_views(pods, self.cluster.name)
        plan = self.place()
        replicas, drain = self.scale(plan.leaving)
        self.kube.apply(manifests.statefulset(self.cluster, replicas, config_text))
        self.data_safety(replicas)
        spark_conditions = self.spark(replicas, plan.shards)
        outcome = self.write_status(plan, replicas, drain, [
            self.degraded(), self.replication(len(plan.staying)), *spark_conditions])
        if self.restoring and not outcome.waiting:
            outcome = dataclasses.replace(outcome, waiting="the restore Job runs")
        if self.missing and not outcome.waiting:
            # No watch on Secrets and ConfigMaps: looked at again soon, so the condition
            # clears once someone creates or mends what is missing.
            outcome = dataclasses.replace(outcome, waiting=self.missing[0][1])
        return outcome

    def report(self, site: str) -> SiteReport:
        """What the site's own pod says of it; of a site gone with its volume (no pod of
        its own), what the first ready pod says."""
        if site not in self.reports:
            ordinal = next((o for o, s in self.ids.items() if s == site), None)
            pod = self.pods.get(ordinal) if ordinal is not None else next(
                (view for _, view in sorted(self.pods.items()) if view.ready), None)
            self.reports[site] = self.ask(pod.ip if pod else None, self.cluster.http_port,
                                          site, self.credentials)
        return self.reports[site]

    def assign_sites(self) -> dict[int, str]:
        """Site IDs for every ordinal up to the larger of spec and StatefulSet, published
        before any pod that reads them starts; a new ID for an ordinal whose claim (volume)
        was replaced. Records each site's claim."""
        cluster, kube = self.cluster, self.kube
        map_name = c.sites_map_name(cluster.name)
        published = _data(kube.get(path("v1", "ConfigMap", cluster.namespace, map_name)))
        known = sites.merge_known(published, self.previous.get("siteIds"))
        claims = {ordinal: claim["metadata"]["uid"]
                  for ordinal, claim in status.by_ordinal(kube.list(
                      "v1", "PersistentVolumeClaim", cluster.namespace,
                      c.selector_labels(cluster.name)), cluster.name, "data-").items()}
        rebound = sites.rebind(sites.assign(known, max(cluster.replicas, self.current)),
                               sites.bound_claims(published), claims)
        for ordinal, old in rebound.replaced.items():
            if old not in self.gone:
                self.gone.append(old)
            self.emit("Warning", "SiteReplaced", (
                f"claim {c.data_claim_name(cluster.name, ordinal)} is a new volume: pod"
                f" ordinal {ordinal} is site {rebound.ids[ordinal]} now; site {old} is gone"
                f" with its old volume (its replicas are placed on other sites)"))
        kube.apply(manifests.config_map(cluster, map_name,
                                        sites.as_map_data(rebound.ids, rebound.claims)))
        fresh = [f"{ordinal} -> {site}" for ordinal, site in rebound.ids.items()
                 if ordinal not in known]
        if fresh:
            self.emit("Normal", "SitesAssigned", "site IDs by pod ordinal: " + ", ".join(fresh))
        self.claims = claims
        return rebound.ids

    def name_pod_sites(self, pods: Mapping[int, Mapping[str, Any]]) -> None:
        """Each pod whose claim is bound gets its site as an annotation: what a pod on a
        volume without a site yet waits for (contract section 2)."""
        for ordinal, pod in pods.items():
            site = self.ids.get(ordinal)
            annotations = pod["metadata"].get("annotations") or {}
            if (site is not None and ordinal in self.claims
                    and annotations.get(c.SITE_ANNOTATION) != site):
                self.kube.annotate("v1", "Pod", self.cluster.namespace,
                                   pod["metadata"]["name"], {c.SITE_ANNOTATION: site})

    def apply_children(self) -> str:
        """The config, the Secrets, the Services, the brokers' ServiceAccount and RBAC, the
        PodDisruptionBudget and the ServiceMonitor. Returns the rendered broker.toml."""
        cluster, kube = self.cluster, self.kube
        config_text = broker_config.render_toml(broker_config.settings(
            cluster, self.bootstrap_sites))
        kube.apply(manifests.config_map(cluster, c.config_map_name(cluster.name),
                                        {c.CONFIG_FILE: config_text}))
        cookie_lost = ensure_cookie(kube, cluster, self.statefulset, self.emit)
        self.credentials, key_problem = ensure_api_key(kube, cluster, self.emit)
        ensure_user(kube, cluster, self.emit)
        self.lost_secrets = [(reason, problem) for reason, problem in (
            ("CookieMissing", cookie_lost), ("ApiKeyUnusable", key_problem)) if problem]
        self.missing = references.missing(cluster, self.keys_of)
        self.lost_secrets += self.missing
        kube.apply(manifests.headless_service(cluster))
        for account in (manifests.broker_service_account, manifests.broker_role,
                        manifests.broker_role_binding):
            kube.apply(account(cluster))
        pdb_version = "policy/v1" if kube.served("policy/v1") else "policy/v1beta1"
        kube.apply(manifests.pod_disruption_budget(cluster, pdb_version))
        if cluster.service_monitor and kube.served("monitoring.coreos.com/v1"):
            kube.apply(manifests.service_monitor(cluster))
        return config_text

    def ready(self, replicas: int) -> int:
        return sum(1 for ordinal, pod in self.pods.items() if ordinal < replicas and pod.ready)

    def data_safety(self, replicas: int) -> None:
        """The client Service, the restore Job and the backup CronJob: the Service first,
        since the Jobs reach the brokers at its address, with the clients' ports withheld
        while a new cluster waits for its restore (a client's session would make the
        cluster non-empty, and the import refuses a cluster holding data)."""
        cluster, kube, previous = self.cluster, self.kube, self.previous
        restore = b.RestoreSpec.from_spec(cluster.restore_from)
        record, new_cluster = previous.get("restore"), not previous
        pods = (reconcile_backup.job_pods(kube, cluster) if cluster.backup or restore
                or previous.get("backups") or record else [])
        withheld = restore is not None and (record is not None or new_cluster) and (
            record or {}).get("state") != "Succeeded"
        ip = kube.apply(manifests.client_service(cluster, withheld))["spec"].get("clusterIP")
        url = b.api_url(ip, cluster) if ip and ip != "None" else None
        all_ready = replicas == cluster.replicas and self.ready(replicas) >= replicas
        step = reconcile_backup.reconcile_restore(kube, cluster, restore, record, new_cluster,
                                                  pods, all_ready, url, self.emit, self.now)
        if step.withheld != withheld:
            kube.apply(manifests.client_service(cluster, step.withheld))
        self.restore = step.status
        self.restoring = bool(step.status and step.status.get("state") == "Running")
        self.backup = reconcile_backup.reconcile_backups(
            kube, cluster, b.BackupSpec.from_spec(cluster.backup), previous.get("backups"),
            pods, url, self.emit, self.now)
        self.data_problems = [p for p in (step.problem, self.backup.problem) if p]

    def keys_of(self, kind: str, name: str) -> set[str] | None:
        """The names of an object's keys (never their values); None: it does not exist."""
        found = self.kube.get(path("v1", kind, self.cluster.namespace, name))
        if found is None:
            return None
        return {*(found.get("data") or {}), *(found.get("binaryData") or {})}

    def place(self) -> _Placement:
        """Plans shard replicas over the staying sites, keeping the most of the published
        plan, and publishes it with the transitions the brokers have not yet settled."""
        cluster, kube, ids = self.cluster, self.kube, self.ids
        staying = [ids[ordinal] for ordinal in range(cluster.replicas)]
        leaving = [ids[ordinal] for ordinal in range(cluster.replicas, self.current)]
        map_name = c.placement_map_name(cluster.name)
        plan_data = _data(kube.get(path("v1", "ConfigMap", cluster.namespace, map_name)))
        old_doc = json.loads(plan_data[c.PLACEMENT_FILE]) if plan_data else {"revision": 0}
        old_shards = placement.from_data(old_doc.get("shards", {}))
        shards = placement.plan(old_shards, staying, cluster.n_shards,
                                cluster.replication_factor)
        revision, pending = old_doc["revision"], list(old_doc.get("transitions", []))
        if shards != old_shards:
            changes = placement.transitions(old_shards, shards)
            # The first plan creates shards; only later revisions move replicas between
            # brokers.
            pending = [change.as_dict() for change in changes] if revision else []
            revision += 1
            copies = sum(len(change.add) for change in changes)
            self.emit("Normal", "PlacementChanged",
                      f"revision {revision}: {len(changes)} shard(s) change, {copies}"
                      f" replica(s) to copy onto sites {', '.join(staying)}")
        self.gone = [site for site in self.gone if still_held(self.report(site))]
        members = set(staying) | set(leaving)
        pending = [t for t in pending if not settled(
            placement.Transition.from_dict(t),
            {s: self.report(s) for s in (*t["add"], *t["remove"]) if s in members}, members)]
        kube.apply(manifests.config_map(cluster, map_name, {
            c.PLACEMENT_FILE: manifests.placement_document(
                revision, cluster, staying, [*leaving, *self.gone], placement.as_data(shards),
                pending)}))
        return _Placement(staying, leaving, shards, revision, pending)

    def scale(self, leaving: list[str]) -> tuple[int, dict[str, Any] | None]:
        """The StatefulSet's size: down only once the leaving brokers are drained (or the
        spec does not ask to wait for them). Returns (replicas, the drain still waited for)."""
        cluster, current = self.cluster, self.current
        if cluster.replicas > current and self.statefulset is not None:
            self.emit("Normal", "ScaledUp", f"StatefulSet {current} -> {cluster.replicas}")
        if cluster.replicas >= current:
            return cluster.replicas, None
        verdict = drain_verdict([self.report(site) for site in leaving],
                                cluster.require_drain_confirmation)
        old_drain = self.previous.get("drain") or {}
        if old_drain.get("sites") != leaving:
            self.emit("Normal", "DrainStarted",
                      f"moving shard replicas off sites {', '.join(leaving)} before scaling"
                      f" {current} -> {cluster.replicas}")
        kind = "Normal" if verdict.reason == "DrainConfirmed" else "Warning"
        if verdict.proceed:
            self.emit(kind, verdict.reason, verdict.message)
            self.emit("Normal", "ScaledDown", f"StatefulSet {current} -> {cluster.replicas}")
            return cluster.replicas, None
        if old_drain.get("message") != verdict.message:
            self.emit(kind, verdict.reason, verdict.message)
        return current, {"sites": leaving, "from": current, "to": cluster.replicas,
                         "reason": verdict.reason, "message": verdict.message}

    def degraded(self) -> dict[str, Any]:
        """The Degraded condition: spec problems and unusable Secrets, each news one
        Warning."""
        found = [*problems(self.cluster), *self.data_problems]
        if self.requested.n_shards != self.created_shards:
            found.append(f"spec.durableStorage.nShards cannot change after creation: it stays"
                         f" {self.created_shards}")
        reason = (self.lost_secrets[0][0] if self.lost_secrets
                  else "InvalidSpec" if found else "SpecValid")
        found += [problem for _, problem in self.lost_secrets]
        condition = status.condition(self.conditions, "Degraded", bool(found), reason,
                                     "; ".join(found) or "no problems found", self.now)
        if found and _changed(self.conditions, condition):
            self.emit("Warning", reason, condition["message"])
        return condition

    def spark(self, replicas: int, shards: placement.Placement) -> list[dict[str, Any]]:
        """The SparkJobs condition, after launching and collecting applications; none
        without a Spark section."""
        cluster = self.cluster
        if cluster.spark is None:
            return []
        members = {site: ordinal for ordinal, site in self.ids.items() if ordinal < replicas}
        self.spark_status, ok, reason, message = reconcile_spark(
            self.kube, cluster, spark.Settings.from_spec(cluster.spark),
            self.previous.get("spark") or {}, self.pods,
            {shard: [members[site] for site in holders if site in members]
             for shard, holders in shards.items()},
            self.emit, self.ask_sealed, self.credentials)
        condition = status.condition(self.conditions, "SparkJobs", ok, reason, message,
                                     self.now)
        if not ok and _changed(self.conditions, condition):
            self.emit("Warning", reason, message)
        return [condition]

    def replication(self, sites: int) -> dict[str, Any]:
        """The ReplicationCapped condition: a factor above the number of sites is accepted
        (a cluster may start with one pod and grow) and applied as far as the sites allow,
        as the brokers do; the condition says how far, and a Normal Event each change."""
        factor = self.cluster.replication_factor
        applied = placement.replicas_per_shard(factor, sites)
        capped = applied < factor
        message = (f"spec.durableStorage.replicationFactor is {factor} and there are {sites}"
                   f" site(s): each shard keeps {applied} replica(s) until there are {factor}"
                   if capped else f"each shard keeps {factor} replica(s)")
        condition = status.condition(self.conditions, "ReplicationCapped", capped,
                                     "FewerSitesThanFactor" if capped else "FactorApplied",
                                     message, self.now)
        if capped and _changed(self.conditions, condition):
            self.emit("Normal", "ReplicationCapped", message)
        return condition

    def write_status(self, plan: _Placement, replicas: int, drain: dict[str, Any] | None,
                     conditions: list[dict[str, Any]]) -> Outcome:
        """Status from what this pass saw; the Ready and Progressing conditions lead
        `conditions`. Returns why the next pass must come soon."""
        cluster, pending = self.cluster, plan.pending
        ready = self.ready(replicas)
        settled_all = drain is None and replicas == cluster.replicas and ready >= replicas
        # Pending transitions are worth asking about again only while some broker answers;
        # otherwise the next pod event (a broker becoming ready) brings the operator back.
        answering = any(report.reachable for report in self.reports.values())
        waiting = drain["message"] if drain else (
            f"{len(pending)} replica transition(s) pending" if pending and answering else "")
        degraded = any(cond["type"] == "Degraded" and cond["status"] == "True"
                       for cond in conditions)
        self.kube.patch_status(cluster.namespace, cluster.name, status.merge_patch(
            self.previous, {
                "observedGeneration": cluster.generation,
                "replicas": replicas,
                "readyReplicas": ready,
                "selector": ",".join(f"{k}={v}" for k, v in sorted(
                    c.selector_labels(cluster.name).items())),
                "phase": status.phase(ready, cluster.replicas, drain is not None, degraded),
                "siteCount": len(plan.staying),
                "siteIds": sites.as_data(self.ids),
                "goneSites": self.gone,
                "sites": status.sites(self.ids, max(replicas, cluster.replicas), self.pods,
                                      cluster.name),
                "placement": {"revision": plan.revision, "nShards": cluster.n_shards,
                              "bootstrapSites": self.bootstrap_sites,
                              "replicationFactor": cluster.replication_factor,
                              "shards": placement.as_data(plan.shards),
                              "loads": placement.loads(plan.shards, plan.staying)},
                "transitions": pending,
                "drain": drain,
                "spark": self.spark_status,
                "backups": self.backup.status if self.backup else None,
                "restore": self.restore,
                "conditions": [
                    status.condition(self.conditions, "Ready", settled_all,
                                     "AllSitesReady" if settled_all else "NotReady",
                                     f"{ready}/{cluster.replicas} brokers ready", self.now),
                    status.condition(
                        self.conditions, "Progressing", not settled_all or bool(pending),
                        drain["reason"] if drain else (
                            "TransitionsPending" if pending else "Reconciled"),
                        waiting or f"{len(pending)} replica transition(s) pending", self.now),
                    *conditions,
                ],
            }))
        return Outcome(waiting, polls=cluster.spark is not None, state=ClusterState(
            cluster.replicas, ready, len(pending), drain is not None,
            self.backup.freshness if self.backup else None))
