"""What the operator decides about SparkApplications: which to create, which to delete, and
what the MQTTCluster status says about them.

Pure, like placement: the reconcile only feeds it what the API server and the brokers said.
The decisions must survive an operator restart and the deletion of old applications, so
"already launched" is a watermark per (job, shard) kept in status and raised by every
application still listed: a generation at or below it is never launched again, even after
retention has deleted its application.
"""

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mqtt_operator import sparkapp
from mqtt_operator.sparkapp import Job, Resources, Run, SparkSpec

ON_SEAL = "onSeal"
# The Spark operator's terminal states (restartPolicy OnFailure: FAILED once retries ran out).
FINISHED = frozenset({"COMPLETED", "FAILED", "SUBMISSION_FAILED"})
_INTERVAL = re.compile(r"^([1-9][0-9]*)(m|h|d)$")
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400}


def interval_seconds(schedule: str) -> int | None:
    """`onSeal` -> None; a fixed interval `30m`, `1h`, `1d` -> seconds. Ticks are aligned to
    the epoch, so `1h` ticks on the hour and `1d` at midnight UTC, whoever computes them."""
    if schedule == ON_SEAL:
        return None
    match = _INTERVAL.match(schedule)
    if not match:
        raise ValueError(f"spark.schedule must be {ON_SEAL} or an interval like 30m, 1h, 1d:"
                         f" {schedule!r}")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


@dataclass(frozen=True)
class Settings:
    """The MQTTCluster's `spec.spark` (CRD defaults applied by the API server)."""

    interval: int | None  # None: on seal
    jobs: tuple[Job, ...]
    keep_finished: int
    app: SparkSpec

    @classmethod
    def from_spec(cls, spark: Mapping[str, Any]) -> "Settings":
        driver, executor = spark["driver"], spark["executor"]
        return cls(
            interval=interval_seconds(spark["schedule"]),
            jobs=tuple(Job(job["job"], job.get("output") or job["job"],
                           job.get("topicFilter", "")) for job in spark["jobs"]),
            keep_finished=spark["retention"]["keepFinished"],
            app=SparkSpec(
                image=spark["image"], output_claim=spark["output"]["claimName"],
                spark_version=spark["sparkVersion"], service_account=spark["serviceAccount"],
                driver=Resources(driver["cores"], driver["memory"], driver.get("coreRequest")),
                executor=Resources(executor["cores"], executor["memory"],
                                   executor.get("coreRequest")),
                executors=executor["instances"]),
        )


def sources(sealed: Mapping[int, Iterable[tuple[int, int]]],
            replicas: Mapping[int, Sequence[int]]) -> dict[tuple[int, int], int]:
    """(shard, generation) -> the pod ordinal whose volume the application reads.

    `sealed`: what each answering broker reported sealed, by ordinal. The shard's replicas
    in placement order come first (the same pod every time, and shards spread over pods),
    then any other broker that has it."""
    found: dict[tuple[int, int], int] = {}
    for shard_generation in sorted({sg for held in sealed.values() for sg in held}):
        preferred = [*replicas.get(shard_generation[0], ()), *sorted(sealed)]
        found[shard_generation] = next(
            ordinal for ordinal in preferred
            if ordinal in sealed and shard_generation in set(sealed[ordinal]))
    return found


def watermark_key(job: str, run: Run) -> str:
    return f"{job}/{run.shard}/" + ("generation" if run.generation is not None else "tick")


def _position(run: Run) -> int:
    return run.generation if run.generation is not None else run.tick or 0


def _order(job: str, run: Run) -> tuple[str, int, bool, int]:
    return job, run.shard, run.generation is None, _position(run)


@dataclass(frozen=True)
class AppView:
    """A listed SparkApplication, read back from the labels the operator gave it."""

    name: str
    job: str
    run: Run
    state: str
    created: str

    @classmethod
    def from_object(cls, app: Mapping[str, Any]) -> "AppView":
        meta = app["metadata"]
        labels = meta.get("labels") or {}
        shard = int(labels[sparkapp.LABEL_SHARD])
        if sparkapp.LABEL_GENERATION in labels:
            run = Run(shard, generation=int(labels[sparkapp.LABEL_GENERATION]))
        else:
            run = Run(shard, tick=sparkapp.parse_tick(labels[sparkapp.LABEL_TICK]))
        state = ((app.get("status") or {}).get("applicationState") or {}).get("state")
        return cls(meta["name"], labels[sparkapp.LABEL_JOB], run, state or "NEW",
                   meta.get("creationTimestamp", ""))


def watermarks(recorded: Mapping[str, int], apps: Iterable[AppView]) -> dict[str, int]:
    """The highest run launched per (job, shard, kind): status, raised by listed apps (a
    status write lost after a create must not mean a second launch)."""
    marks = dict(recorded)
    for app in apps:
        key = watermark_key(app.job, app.run)
        marks[key] = max(marks.get(key, -1), _position(app.run))
    return marks


@dataclass(frozen=True)
class Planned:
    job: Job
    run: Run
    ordinal: int  # whose data volume it reads


def planned(settings: Settings, located: Mapping[tuple[int, int], int],
            marks: Mapping[str, int], now: float,
            running: Iterable[AppView] = ()) -> list[Planned]:
    """Applications that should exist and were never launched.

    On seal: one per job and sealed (shard, generation) above the watermark. On a schedule:
    one per job and shard that has sealed data, for the current tick, if not launched yet;
    it reads the replica that holds the shard's newest sealed generation. Tick runs of a
    job and shard share a streaming checkpoint (what they have read), so one waits while
    an earlier tick's application of `running` (the listed ones) has not finished."""
    if settings.interval is None:
        runs = {Run(shard, generation=gen): ordinal for (shard, gen), ordinal in located.items()}
    else:
        tick = int(now) // settings.interval * settings.interval
        newest = {shard: ordinal for (shard, _gen), ordinal in sorted(located.items())}
        runs = {Run(shard, tick=tick): ordinal for shard, ordinal in newest.items()}
    busy = {(app.job, app.run.shard) for app in running
            if app.run.tick is not None and app.state not in FINISHED}
    return sorted(
        (Planned(job, run, ordinal) for run, ordinal in runs.items() for job in settings.jobs
         if _position(run) > marks.get(watermark_key(job.kind, run), -1)
         and (run.tick is None or (job.kind, run.shard) not in busy)),
        key=lambda plan: _order(plan.job.kind, plan.run))


def launched(marks: Mapping[str, int], created: Iterable[Planned]) -> dict[str, int]:
    updated = dict(marks)
    for plan in created:
        key = watermark_key(plan.job.kind, plan.run)
        updated[key] = max(updated.get(key, -1), _position(plan.run))
    return updated


def expired(apps: Iterable[AppView], keep: int) -> list[str]:
    """Finished applications beyond the newest `keep` per job; running ones always stay."""
    by_job: dict[str, list[AppView]] = {}
    for app in apps:
        if app.state in FINISHED:
            by_job.setdefault(app.job, []).append(app)
    old: list[str] = []
    for finished in by_job.values():
        finished.sort(key=lambda a: (a.created, _position(a.run), a.run.shard), reverse=True)
        old.extend(app.name for app in finished[keep:])
    return sorted(old)


def summary(apps: Iterable[AppView]) -> dict[str, Any]:
    """status.spark: each application with its state, and how many are in each state."""
    entries = []
    counts: dict[str, int] = {}
    for app in sorted(apps, key=lambda a: _order(a.job, a.run)):
        entry: dict[str, Any] = {"name": app.name, "job": app.job, "shard": app.run.shard,
                                 "state": app.state}
        if app.run.generation is not None:
            entry["generation"] = app.run.generation
        else:
            entry["tick"] = sparkapp.tick_label(app.run.tick or 0)
        entries.append(entry)
        counts[app.state] = counts.get(app.state, 0) + 1
    return {"applications": entries, "states": counts}
