"""Per-hour statistics of stored messages, per topic and per LTS stream structure: message
count, payload bytes, distinct publishers and the QoS mix.

    python spark-apps/stats.py DATA_DIR --master local[2] --output OUT [--format csv]
    spark-submit spark-apps/stats.py DATA_DIR --output OUT

Writes OUT/by_topic and OUT/by_stream (hour, topic or structure, messages, bytes,
publishers, qos0, qos1, qos2); without --output, prints them. Both come from one pass over
the slabs (grouping sets); distinct publishers per stream cannot be summed from per-topic
rows, so the stream level is not derived from the topic level.

    python spark-apps/stats.py DATA_DIR --stream --checkpoint CK --output OUT

reads only the generations sealed since the last run with checkpoint CK: their partial
sums are appended to OUT/partials exactly once, and OUT/by_topic and OUT/by_stream are
rewritten from all of them.
"""

from argparse import Namespace
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

import hourly
import slabframe
import streamjob

# Over the partials of hourly.py (one row per hour, topic, structure and publisher of a
# partition, or a few): grouping sets straight over the messages doubled every message (one
# copy per set). The coalesces keep the columns that were counts non-nullable, as in the
# Parquet schema of a direct count. Hours are UTC hours whatever the session's time zone.
_AGGREGATE = """
SELECT timestamp_micros(hour_us) AS hour, topic, structure,
       coalesce(sum(messages), 0) AS messages, sum(bytes) AS bytes,
       count(DISTINCT publisher) AS publishers, coalesce(sum(qos0), 0) AS qos0,
       coalesce(sum(qos1), 0) AS qos1, coalesce(sum(qos2), 0) AS qos2,
       grouping(topic) AS by_stream
FROM partials
GROUP BY GROUPING SETS ((hour_us, topic), (hour_us, structure))
"""
_METRICS = ["messages", "bytes", "publishers", "qos0", "qos1", "qos2"]
LEAN_JVM = True  # the rows are added up in Python: the JVM only plans and writes a few


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = slabframe.arguments("Per-hour message statistics of sealed generations.")
    parser.add_argument("--output", help="directory for by_topic/ and by_stream/")
    parser.add_argument("--format", choices=["parquet", "csv", "json"], default="parquet")
    args = slabframe.parse(parser, argv)
    with slabframe.job_session("mqtt-stats", args.master, lean_jvm=LEAN_JVM) as spark:
        if args.stream:
            summary, partials = _stream_partials(spark, args)
        else:
            partials, report = slabframe.read_slabs(
                spark, args.data, args.selection, hourly.READS, args.strict,
                (hourly.partials, hourly.SCHEMA))
            summary = report.to_json()
        partials.createOrReplaceTempView("partials")
        stats = spark.sql(_AGGREGATE).cache()
        tables = {
            "by_topic": stats.where("by_stream = 0").select("hour", "topic", *_METRICS),
            "by_stream": stats.where("by_stream = 1").select("hour", "structure", *_METRICS),
        }
        # The result is small: one sorted file per table, without the sampling job a
        # global sort would start, and rows counted as they are written (an observation),
        # not by a job of their own: each Spark job costs fixed overhead.
        rows = {}
        for name, table in tables.items():
            table = table.coalesce(1).sortWithinPartitions(*table.columns[:2])
            if args.output:
                written = Observation(name)
                table.observe(written, F.count(F.lit(1)).alias("rows")).write.mode(
                    "overwrite").option("header", True).format(args.format).save(
                    f"{args.output}/{name}")
                rows[name] = written.get["rows"]
            else:
                table.show(1000, truncate=False)
                rows[name] = table.count()
        return {"job": "stats", "rows": rows, **summary}


def _stream_partials(spark: SparkSession, args: Namespace) -> tuple[dict[str, Any], DataFrame]:
    """Streaming mode: the partials of the generations not read yet are appended, exactly
    once, to OUT/partials (hourly.SCHEMA, a streaming Parquet table); the tables are then
    added up from all the partials so far. A run reads only what is new, and an hour that
    spans runs still counts each publisher once."""
    path = f"{args.output}/partials"
    stream = streamjob.read(spark, args, ("hourly.partials", hourly.READS, hourly.SCHEMA))
    summary = streamjob.run(spark, stream.writeStream.format("parquet"), args.checkpoint, path)
    if Path(path, "_spark_metadata").is_dir():  # the schema given: no job to infer it
        return summary, spark.read.schema(from_arrow_schema(hourly.SCHEMA)).parquet(path)
    # nothing sealed yet: no batch ran, so no table exists
    return summary, spark.createDataFrame([], from_arrow_schema(hourly.SCHEMA))

if __name__ == "__main__":
    slabframe.run("stats", main)
