"""Export of sealed generations to Parquet, the data-lake path.

    python spark-apps/export.py DATA_DIR --master local[2] --output OUT
    spark-submit spark-apps/export.py DATA_DIR --output OUT --shard 3 --generation 12

Partitioned by date (UTC), shard, then generation: a generation is exported by overwriting
only its own partitions, so exporting it again (a retried SparkApplication, a re-run)
replaces its files instead of duplicating its rows, and other generations stay as they are.

    python spark-apps/export.py DATA_DIR --stream --checkpoint CK --output OUT

exports only the generations sealed since the last run with checkpoint CK, exactly once: OUT
is then a streaming Parquet table, read through its `_spark_metadata` log (spark.read.parquet
of OUT itself), and must not be written by the batch mode as well.
"""

from typing import Any

from pyspark.sql import functions as F

import slabframe
import streamjob

PARTITIONS = ["date", "shard", "generation"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = slabframe.arguments("Export sealed generations to Parquet.")
    parser.add_argument("--output", required=True, help="Parquet dataset directory")
    args = slabframe.parse(parser, argv)
    with slabframe.job_session("mqtt-export", args.master) as spark:
        if args.stream:
            stream = streamjob.read(spark, args).withColumn("date", F.to_date("timestamp"))
            writer = stream.writeStream.format("parquet").partitionBy(*PARTITIONS)
            return {"job": "export", **streamjob.run(spark, writer, args.checkpoint, args.output)}
        messages, report = slabframe.read_messages(
            spark, args.data, args.selection, args.strict)
        (messages.withColumn("date", F.to_date("timestamp"))
            .write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
            .partitionBy(*PARTITIONS).parquet(args.output))
        return {"job": "export", **report.to_json()}


if __name__ == "__main__":
    slabframe.run("export", main)
