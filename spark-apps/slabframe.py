"""Sealed slabs as a Spark DataFrame, and what every job shares: arguments, the session,
one-line errors and the report of skipped slabs.

One partition per sealed slab: the driver reads only manifests (slabs.plan) and every
executor copies, verifies and decodes its own slabs (slabs.read_tasks), straight from the
volume, never through the broker.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

import mqtt_ds
import slabs

COLUMNS = [
    "topic", "timestamp", "payload", "qos", "retain", "publisher", "content_type",
    "payload_format", "response_topic", "correlation_data", "message_expiry",
    "user_properties", "shard", "generation", "stream", "structure",
]
# The read columns that differ from the frame's: a timestamp crosses as an integer and
# becomes a Spark timestamp in the JVM (exact, and no datetimes built in Python).
_RAW = {"timestamp": "timestamp_us"}
_SLAB_ERROR = re.compile(r"SlabError: ([^\n]+)")


class _ListParam(AccumulatorParam[list[dict[str, Any]]]):
    def zero(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return []

    def addInPlace(
        self, value1: list[dict[str, Any]], value2: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        value1.extend(value2)
        return value1


class Report:
    """Slabs skipped on the driver (unsealed, bad manifest) and on executors (corrupt,
    vanished). Executor reports arrive through an accumulator, so they are complete only
    after an action; a retried task may report a slab twice, hence the de-duplication."""

    def __init__(self, tasks: list[slabs.SlabTask], skipped: list[slabs.Skipped],
                 problems: Accumulator[list[dict[str, Any]]]) -> None:
        self.tasks = tasks
        self.skipped = skipped
        self._problems = problems

    def to_json(self) -> dict[str, Any]:
        failed = {s["path"]: s for s in self._problems.value}
        skipped = [s.to_json() for s in self.skipped] + list(failed.values())
        return {"slabs_read": len(self.tasks) - len(failed),
                "skipped": sorted(skipped, key=lambda s: (s["shard"], s["generation"]))}


def read_messages(
    spark: SparkSession, path: Path, selection: slabs.Selection, strict: bool = False,
    columns: Sequence[str] = COLUMNS,
) -> tuple[DataFrame, Report]:
    """The messages of the sealed slabs under `path` that match `selection`, with
    `columns` (of COLUMNS). Spark cannot prune the columns of a Python function's output,
    so a job that names the few it uses spares building and copying the others."""
    schema = pa.schema([slabs.SCHEMA.field(_RAW.get(c, c)) for c in columns])
    frame, report = read_slabs(spark, path, selection, schema, strict)
    if "timestamp" in columns:
        frame = frame.withColumn("timestamp", F.expr("timestamp_micros(timestamp_us)"))
    return frame.select(*columns), report


Combine = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def read_slabs(
    spark: SparkSession, path: Path, selection: slabs.Selection, reads: pa.Schema,
    strict: bool = False, combine: tuple[Combine, pa.Schema] | None = None,
) -> tuple[DataFrame, Report]:
    """The selected messages as the reader's columns `reads` (slabs.SCHEMA's fields and
    ttvarrow.PAYLOAD_SIZE), or, with `combine` (a function and its output schema), what
    it makes of each partition's batches: a job that aggregates adds its partition up in
    the Python worker, and a few rows per group cross to the JVM instead of one per
    message. The function must live in a module shipped to executors (session())."""
    tasks, skipped = slabs.plan(path, selection)
    if strict:
        corrupt = [s for s in skipped if s.reason.startswith("corrupt")]
        if corrupt:
            raise slabs.ReaderError(f"{corrupt[0].path}: {corrupt[0].reason}")
    problems = spark.sparkContext.accumulator([], _ListParam())
    # One row per task, one task per partition: each executor task reads its own slab.
    ids = spark.range(len(tasks), numPartitions=max(len(tasks), 1))
    function, output = combine or (None, reads)
    read = partial(_read_partition, tasks, selection, strict, partial(_report, problems),
                   reads, function)
    return ids.mapInArrow(read, from_arrow_schema(output)), Report(tasks, skipped, problems)


def _read_partition(
    tasks: list[slabs.SlabTask], selection: slabs.Selection, strict: bool,
    report: Callable[[slabs.Skipped], None], schema: pa.Schema, combine: Combine | None,
    ids: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    batches = (batch for ids_batch in ids for batch in slabs.read_tasks(
        (tasks[i] for i in ids_batch.column(0).to_pylist()), selection, strict, report,
        schema=schema))
    return batches if combine is None else combine(batches)


def _report(problems: Accumulator[list[dict[str, Any]]], skipped: slabs.Skipped) -> None:
    problems.add([skipped.to_json()])


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("data", type=Path,
                        help="the broker's data dir (node.data_dir), or its ds/messages dir")
    parser.add_argument("--master", help="Spark master, e.g. local[2] (spark-submit sets it)")
    parser.add_argument("--topic-filter",
                        help="MQTT topic filter (+ and #, as the broker matches them); "
                             "default: every message, $SYS/... too")
    parser.add_argument("--since", type=slabs.parse_time, help="ISO 8601 time, inclusive")
    parser.add_argument("--until", type=slabs.parse_time, help="ISO 8601 time, exclusive")
    parser.add_argument("--shard", type=int, help="read only this shard")
    parser.add_argument("--generation", type=int, help="read only this generation")
    parser.add_argument("--strict", action="store_true",
                        help="fail on a corrupt slab instead of skipping it")
    parser.add_argument("--stream", action="store_true",
                        help="read only the generations sealed since the last run with this "
                             "--checkpoint (a Structured Streaming query, Trigger.AvailableNow;"
                             " a slab that cannot be read fails the run)")
    parser.add_argument("--checkpoint", help="the streaming query's checkpoint directory")
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Arguments, with the input checked before a JVM is started for nothing; the
    selection is in `args.selection`."""
    args = parser.parse_args(argv)
    args.selection = slabs.Selection(args.topic_filter, args.since, args.until, args.shard,
                                     args.generation)
    slabs.check_selection(args.selection)
    slabs.messages_dir(args.data)
    if args.stream and not (args.checkpoint and getattr(args, "output", None)):
        raise slabs.ReaderError("--stream needs --checkpoint and --output")
    if args.stream and args.generation is not None:
        raise slabs.ReaderError("--stream reads every generation not read yet: no --generation")
    if args.checkpoint and not args.stream:
        raise slabs.ReaderError("--checkpoint is for --stream")
    return args


def session(app_name: str, master: str | None = None, lean_jvm: bool = False) -> SparkSession:
    """Times in UTC (hours and dates of the output do not depend on the machine), and the
    executor-side modules shipped with the job so spark-submit needs no --py-files.
    `lean_jvm`: for a job whose rows never reach the JVM (see _local_jvm_options)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # Under spark-submit its JVM holds the submitted conf (the master among it); a
        # SparkConf made before the gateway is connected loads none of it, and the job
        # would run on local[*] wherever it was submitted to.
        SparkContext._ensure_initialized()
    conf = SparkConf()
    if master:
        conf.setMaster(master)
    conf.setIfMissing("spark.master", "local[*]")
    local = str(conf.get("spark.master")).startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local run listens on loopback
    conf.setIfMissing("spark.ui.showConsoleProgress", "false")
    if local:
        conf.setIfMissing("spark.driver.host", "127.0.0.1")
        conf.setIfMissing("spark.ui.enabled", "false")
        if "PYSPARK_GATEWAY_PORT" not in os.environ:  # else spark-submit started the JVM
            conf.setIfMissing("spark.driver.extraJavaOptions", _local_jvm_options(lean_jvm))
        # On one machine a shuffle partition per core: the default 200 cost seconds of task
        # overhead, and adaptive execution re-plans every stage of jobs that take a second
        # (and runs each as a job of its own): ~1 s of a warm stats job on local[2].
        cores = _local_cores(conf.get("spark.master"))
        conf.setIfMissing("spark.sql.shuffle.partitions", str(cores))
        conf.setIfMissing("spark.sql.adaptive.enabled", "false")
    conf.set("spark.sql.session.timeZone", "UTC")
    conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    spark = SparkSession.builder.appName(app_name).config(conf=conf).getOrCreate()
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Ships the executor-side modules and registers the `mqtt-ds` data source (done by
    session(); for a session made otherwise, a notebook's)."""
    here = Path(__file__).resolve().parent
    for module in ("ttvarrow.py", "slabs.py", "hourly.py", "generations.py", "mqtt_ds.py",
                   "slabframe.py"):
        spark.sparkContext.addPyFile(str(here / module))
    # The Python process that plans a streaming query from mqtt-ds on the driver gets none
    # of the files added above (only tasks do): it finds the modules through the data
    # source's environment, taken from the context's when it is registered.
    context = spark.sparkContext
    environment = context.environment
    paths = [p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p]
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(here), *paths]))
    python = context.pythonExec
    launcher = here / "python-installed-pyspark"
    # (on a local master only: an executor elsewhere may not have this path)
    if str(context.master).startswith("local") and os.access(launcher, os.X_OK):
        environment["MQTT_DS_PYTHON"] = python
        context.pythonExec = str(launcher)
    try:
        spark.dataSource.register(mqtt_ds.MqttDsDataSource)  # takes pythonExec now
    finally:
        context.pythonExec = python


def _local_cores(master: str | None) -> int:
    """The worker threads of a local master: local, local[N], local[*], local[N,F]."""
    found = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master or "local")
    if found is None or found.group(1) is None:
        return 1
    return os.cpu_count() or 1 if found.group(1) == "*" else int(found.group(1))


def _local_jvm_options(lean: bool) -> str:
    """The JVM of a local session: the classes Spark loads mapped from an archive (AppCDS)
    instead of found, read and verified in ~250 jars. A lean one also has only the quick
    JIT compiler (C1) and the serial collector: when the JVM only plans, schedules and
    writes small results (stats: the rows are aggregated in Python, hourly.py), C2 and the
    collector's threads cost twice the CPU of the whole warm job, on the cores the Python
    workers need (1.4 against 0.6 CPU-s). Where the JVM handles every row (export writes
    them to Parquet) C2 pays: C1 took 1.7x its CPU for 1M messages."""
    lean_options = " -XX:TieredStopAtLevel=1 -XX:+UseSerialGC" if lean else ""
    return f"{_class_data_sharing()}{lean_options}".strip()


def _class_data_sharing() -> str:
    """AppCDS: the first session writes the archive as its JVM exits; it is kept per
    Spark version and Java runtime, and the JVM ignores one that does not match its class
    path. Its logging is off: the warnings of the dump (classes it cannot archive) would
    go to the job's stdout."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mqtt-spark"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return ""
    key = hashlib.sha256(f"{pyspark.__version__} {os.path.realpath(java or '')}".encode())
    archive = cache / f"spark-{key.hexdigest()[:16]}.jsa"
    option = "SharedArchiveFile" if archive.is_file() else "ArchiveClassesAtExit"
    return f"-XX:{option}={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


@contextmanager
def job_session(
    app_name: str, master: str | None, lean_jvm: bool = False
) -> Iterator[SparkSession]:
    """The session a job runs in: the caller's if one is active (tests and notebooks run
    several jobs in one JVM), else a new one, stopped at the end."""
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    spark = session(app_name, master, lean_jvm)
    try:
        yield spark
    finally:
        spark.stop()


def run(name: str, job: Callable[[], dict[str, Any]]) -> None:
    """Runs a job's main: its summary as one JSON line on stdout, skipped slabs on stderr,
    and any failure as one line (exit 2 for bad input, 1 for a failed job)."""
    try:
        summary = job()
    except slabs.ReaderError as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        sys.exit(2)
    except Exception as error:  # Spark wraps executor failures in Java exceptions
        found = _SLAB_ERROR.search(str(error))
        line = found.group(1) if found else f"{type(error).__name__}: {str(error).splitlines()[0]}"
        print(f"{name}: failed: {line}", file=sys.stderr)
        sys.exit(1)
    for skipped in summary.get("skipped", []):
        print(f"{name}: skipped shard {skipped['shard']} generation {skipped['generation']}: "
              f"{skipped['reason']} ({skipped['path']})", file=sys.stderr)
    print(json.dumps(summary, sort_keys=True))
