"""Rows of a messages DataFrame as plain values, to compare with tests.support.slabdata's."""

from collections.abc import Iterable
from typing import Any

from pyspark.sql import DataFrame

import slabframe


def collect(frame: DataFrame) -> list[dict[str, Any]]:
    """Rows as plain values; times as epoch microseconds (what PySpark turns a timestamp
    into depends on the test process's time zone)."""
    columns = [c for c in slabframe.COLUMNS if c != "timestamp"]
    frame = frame.selectExpr(*columns, "unix_micros(timestamp) AS timestamp_us")
    out = []
    for row in frame.collect():
        values = row.asDict()
        values["user_properties"] = [tuple(kv) for kv in values["user_properties"]]
        for column in ("payload", "correlation_data"):
            if values[column] is not None:
                values[column] = bytes(values[column])
        out.append(values)
    return ordered(out)


def ordered(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["shard"], r["timestamp_us"]))
