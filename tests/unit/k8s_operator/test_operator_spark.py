"""Spark decisions without a cluster: settings from the CRD's defaults, which broker's volume
a generation is read from, what to launch (never twice), what retention deletes, status."""

from typing import Any

import pytest

from mqtt_operator import spark, sparkapp
from mqtt_operator.reconcile import reconcile_spark
from mqtt_operator.spark import AppView, Planned, Settings
from mqtt_operator.sparkapp import Job, Run
from mqtt_operator.spec import Cluster
from tests.support.crd import body

HOUR = 3600
NOW = 1763769600 + 5 * 60  # 2025-11-22T00:05:00Z


def settings(**section: Any) -> Settings:
    cluster = Cluster.from_body(body(spark={"image": "spark:1", "output": {"claimName": "lake"},
                                            **section}))
    assert cluster.spark is not None
    return Settings.from_spec(cluster.spark)


def test_settings_from_the_crd_defaults() -> None:
    defaults = settings()
    assert defaults.interval is None  # onSeal
    assert defaults.jobs == (Job("stats", "stats"),)
    assert defaults.keep_finished == 10
    assert defaults.app == sparkapp.SparkSpec(image="spark:1", output_claim="lake")
    custom = settings(schedule="30m", jobs=[{"job": "export", "output": "lake/raw",
                                              "topicFilter": "fleet/#"}],
                      executor={"instances": 3, "memory": "4g", "coreRequest": "250m"},
                      retention={"keepFinished": 2})
    assert custom.interval == 1800
    assert custom.jobs == (Job("export", "lake/raw", "fleet/#"),)
    assert (custom.app.executors, custom.app.executor, custom.app.driver) == (
        3, sparkapp.Resources(1, "4g", "250m"), sparkapp.Resources(1, "1g"))


@pytest.mark.parametrize(("text", "seconds"), [
    ("onSeal", None), ("30m", 1800), ("1h", HOUR), ("2d", 2 * 86400)])
def test_schedules(text: str, seconds: int | None) -> None:
    assert spark.interval_seconds(text) == seconds


@pytest.mark.parametrize("text", ["@hourly", "0h", "1w", "*/5 * * * *"])
def test_unsupported_schedules_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="onSeal or an interval"):
        spark.interval_seconds(text)


def test_sources_prefer_the_shards_replicas_in_placement_order() -> None:
    sealed = {0: {(0, 1), (1, 1)}, 1: {(0, 1), (1, 1), (1, 2)}, 2: {(2, 5)}}
    replicas = {0: [1, 0], 1: [0, 1], 2: [0, 1]}  # shard 2's replicas did not answer
    assert spark.sources(sealed, replicas) == {
        (0, 1): 1, (1, 1): 0, (1, 2): 1, (2, 5): 2}


def view(name: str, job: str, run: Run, state: str = "NEW", created: str = "") -> AppView:
    return AppView(name, job, run, state, created)


def test_on_seal_launches_each_sealed_generation_once() -> None:
    stats = settings(jobs=[{"job": "stats"}, {"job": "export"}])
    located = {(0, 1): 0, (0, 2): 0, (1, 1): 2}
    first = spark.planned(stats, located, {}, NOW)
    assert [(p.job.kind, p.run, p.ordinal) for p in first] == [
        ("export", Run(0, generation=1), 0), ("export", Run(0, generation=2), 0),
        ("export", Run(1, generation=1), 2), ("stats", Run(0, generation=1), 0),
        ("stats", Run(0, generation=2), 0), ("stats", Run(1, generation=1), 2)]
    marks = spark.launched({}, first)
    assert marks["stats/0/generation"] == 2 and marks["export/1/generation"] == 1
    assert spark.planned(stats, located, marks, NOW) == []
    # Retention deleted every application: the recorded watermark still holds.
    assert spark.planned(stats, {**located, (0, 3): 1}, marks, NOW) == [
        Planned(Job("export", "export"), Run(0, generation=3), 1),
        Planned(Job("stats", "stats"), Run(0, generation=3), 1)]


def test_listed_applications_raise_a_lost_watermark() -> None:
    apps = [view("a", "stats", Run(0, generation=4)), view("b", "stats", Run(0, tick=NOW))]
    marks = spark.watermarks({"stats/0/generation": 2}, apps)
    assert marks == {"stats/0/generation": 4, "stats/0/tick": NOW}
    assert spark.planned(settings(), {(0, 4): 0}, marks, NOW) == []


def test_schedule_launches_one_per_shard_per_tick() -> None:
    hourly = settings(schedule="1h")
    located = {(0, 1): 0, (0, 2): 1, (3, 7): 2}
    plans = spark.planned(hourly, located, {}, NOW)
    tick = NOW // HOUR * HOUR
    assert [(p.run, p.ordinal) for p in plans] == [
        (Run(0, tick=tick), 1), (Run(3, tick=tick), 2)]  # the newest generation's holder
    marks = spark.launched({}, plans)
    assert spark.planned(hourly, located, marks, NOW + 60) == []  # same tick
    assert len(spark.planned(hourly, located, marks, NOW + HOUR)) == 2  # the next one
    # A tick's run still going: the next tick of that job and shard waits for it (both
    # would use one streaming checkpoint); a finished one does not hold it back.
    running = [view("a", "stats", Run(0, tick=tick), "RUNNING"),
               view("b", "stats", Run(3, tick=tick), "COMPLETED")]
    later = spark.planned(hourly, located, marks, NOW + HOUR, running)
    assert [p.run.shard for p in later] == [3]


def test_retention_keeps_the_newest_finished_per_job_and_every_running_one() -> None:
    apps = [view(f"s{g}", "stats", Run(0, generation=g), "COMPLETED", f"2025-11-22T00:0{g}:00Z")
            for g in range(5)]
    apps += [view("s9", "stats", Run(1, generation=9), "RUNNING", "2025-11-21T00:00:00Z"),
             view("f", "stats", Run(1, generation=1), "FAILED", "2025-11-21T00:00:00Z"),
             view("e", "export", Run(0, generation=1), "COMPLETED", "2025-11-21T00:00:00Z")]
    assert spark.expired(apps, 2) == ["f", "s0", "s1", "s2"]
    assert spark.expired(apps, 10) == []


def test_application_read_back_and_summarized() -> None:
    created = sparkapp.spark_application(
        cluster="prod", namespace="iot", owner={}, job=Job("stats", "stats"),
        run=Run(3, generation=12), broker_pod="prod-0", data_claim="data-prod-0",
        spec=sparkapp.SparkSpec(image="i", output_claim="o"))
    fresh = AppView.from_object(created)
    assert (fresh.name, fresh.job, fresh.run, fresh.state) == (
        "prod-stats-s3-g12", "stats", Run(3, generation=12), "NEW")
    done = AppView.from_object({**created, "status": {"applicationState": {
        "state": "COMPLETED"}}})
    tick = AppView.from_object(sparkapp.spark_application(
        cluster="prod", namespace="iot", owner={}, job=Job("export", "x"),
        run=Run(0, tick=NOW // HOUR * HOUR), broker_pod="prod-0", data_claim="d",
        spec=sparkapp.SparkSpec(image="i", output_claim="o")))
    assert spark.summary([done, tick, fresh]) == {
        "applications": [
            {"name": "prod-export-s0-t202511220000", "job": "export", "shard": 0,
             "state": "NEW", "tick": "202511220000"},
            {"name": "prod-stats-s3-g12", "job": "stats", "shard": 3, "state": "COMPLETED",
             "generation": 12},
            {"name": "prod-stats-s3-g12", "job": "stats", "shard": 3, "state": "NEW",
             "generation": 12}],
        "states": {"COMPLETED": 1, "NEW": 2}}


class NoSparkOperator:
    """An API server without the SparkApplication CRD: anything but discovery is a bug."""

    def served(self, group_version: str) -> bool:
        return group_version != sparkapp.API_VERSION

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{name} called although the CRD is absent")


def test_without_the_spark_operator_nothing_is_done_and_the_condition_says_why() -> None:
    cluster = Cluster.from_body(body(spark={"image": "i", "output": {"claimName": "o"}}))
    assert cluster.spark is not None
    previous = {"launched": {"stats/0/generation": 3}}
    kube: Any = NoSparkOperator()
    summary, ok, reason, message = reconcile_spark(
        kube, cluster, Settings.from_spec(cluster.spark), previous, {}, {},
        lambda *_: None, lambda *_: None, None)
    assert (summary, ok, reason) == (previous, False, "SparkOperatorMissing")
    assert "sparkoperator.k8s.io/v1beta2 is not served" in message
