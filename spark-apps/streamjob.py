"""What the jobs' streaming mode (`--stream --checkpoint DIR`) shares: the mqtt-ds stream of
the job's selection, one Trigger.AvailableNow run of a query to its sink, and its summary.

Each run reads only the sealed generations the checkpoint has not seen, in as many
micro-batches as they take, and stops; a run that dies is finished by the next one with
the same checkpoint, and the file sink's log (`_spark_metadata`) makes each batch's files
appear once. The operator's interval jobs are such runs.
"""

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.readwriter import DataStreamWriter

import generations
import mqtt_ds
import slabs

# Spark's default checkpoint file manager renames through Hadoop's FileContext, which on a
# local file system, without Hadoop's native library (pyspark ships none), asks a `readlink`
# child process about both names at every step of every rename: 32 processes a run (the
# offset, commit and sink logs, the checkpoint's metadata), ~0.2 CPU-s that a batch run does
# not pay. The FileSystem-based manager checks the same (the target must not exist yet, then
# rename) inside the JVM; on a local file system both check, then rename.
_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
_FILE_SYSTEM_MANAGER = ("org.apache.spark.sql.execution.streaming.checkpointing."
                        "FileSystemBasedCheckpointFileManager")


def read(spark: SparkSession, args: argparse.Namespace,
         combine: tuple[str, pa.Schema, pa.Schema] | None = None) -> DataFrame:
    """The messages of the job's selection as a stream; with `combine` (the function's
    "module.name", the reader's columns it takes, its output schema), what that function
    makes of each slab's batches in the Python worker."""
    selection: slabs.Selection = args.selection
    options = {"topicFilter": selection.topic_filter, "since": iso(selection.since),
               "until": iso(selection.until), "shard": selection.shard}
    reader = spark.readStream.format(mqtt_ds.NAME).options(
        **{k: str(v) for k, v in options.items() if v is not None})
    if combine is not None:
        function, reads, output = combine
        reader = reader.option("combine", function).option(
            "columns", ",".join(reads.names)).schema(from_arrow_schema(output))
    return reader.load(str(args.data))


def iso(us: int | None) -> str | None:
    """Microseconds back to the ISO 8601 the source parses (exact: whole microseconds)."""
    if us is None:
        return None
    seconds, micros = divmod(us, 1_000_000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=micros).isoformat()


def run(spark: SparkSession, writer: DataStreamWriter, checkpoint: str,
        path: str) -> dict[str, Any]:
    """Runs the query until everything sealed when it started is in `path`; the summary
    counts its micro-batches, rows and slabs, and the offset it reached."""
    with _checkpoint_manager(spark, checkpoint, path):
        query = (writer.option("checkpointLocation", checkpoint).trigger(availableNow=True)
                 .start(path))
        query.awaitTermination()
    offsets, rows = [], 0
    for progress in query.recentProgress:  # the last 100 batches (Spark keeps no more)
        source = progress["sources"][0] if progress["sources"] else None
        if source is not None and source["startOffset"] != source["endOffset"]:
            offsets.append((_offset(source["startOffset"]), _offset(source["endOffset"])))
            rows += progress["numInputRows"]
    return {"stream": True, "batches": len(offsets), "input_rows": rows,
            "slabs_read": generations.slab_count(offsets),
            "offset": offsets[-1][1] if offsets else None}


@contextmanager
def _checkpoint_manager(spark: SparkSession, *paths: str) -> Iterator[None]:
    """The FileSystem-based manager for a query whose logs are all on local files, unless
    the session names a manager of its own; the session's setting is restored after."""
    if spark.conf.get(_MANAGER, None) is not None or any(
            urlparse(path).scheme not in ("", "file") for path in paths):
        yield
        return
    spark.conf.set(_MANAGER, _FILE_SYSTEM_MANAGER)
    try:
        yield
    finally:
        spark.conf.unset(_MANAGER)


def _offset(text: str | None) -> dict[str, Any] | None:
    return None if text in (None, "null") else json.loads(text)  # type: ignore[arg-type]
