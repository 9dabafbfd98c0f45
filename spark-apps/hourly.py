"""Per hour (UTC), topic, structure and publisher: how many messages, their payload bytes
and how many of each QoS, added up in the Python worker that decodes the slab.

A map-side partial aggregate. Without it every message crossed to the JVM as a row to be
aggregated there, which cost as much JVM time as the decoding cost Python time (about a
microsecond a row each, measured on local[2]); now a few rows per group cross and Spark
adds the partials up (stats.py). A partition's partials are merged while that shrinks
them and handed over as soon as it no longer does, so the memory they take stays bounded
whatever the number of groups.
"""

from collections.abc import Iterable, Iterator
from typing import Final

import numpy as np
import pyarrow as pa

import slabs
import ttvarrow

HOUR_US: Final = 3_600_000_000
READS: Final = pa.schema([slabs.SCHEMA.field(name) for name in (
    "timestamp_us", "topic", "structure", "publisher", "qos")] + [ttvarrow.PAYLOAD_SIZE])
KEYS: Final = ["hour_us", "topic", "structure", "publisher"]
METRICS: Final = ["messages", "bytes", "qos0", "qos1", "qos2"]
SCHEMA: Final = pa.schema([READS.field("timestamp_us").with_name("hour_us"),
                           *(READS.field(key) for key in KEYS[1:]),
                           *((metric, pa.int64()) for metric in METRICS)])
_MERGE_ROWS: Final = 1 << 20  # rows held (per message or partial) before they are summed


def partials(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Batches of READS in, batches of SCHEMA out: one row per group, or a few."""
    pending: list[pa.Table] = []  # per message, or partials already summed
    rows = 0
    for batch in batches:
        pending.append(_per_message(batch))
        rows += batch.num_rows
        if rows >= _MERGE_ROWS:
            merged = _sums(pa.concat_tables(pending))
            pending, rows = [merged], merged.num_rows
            if rows * 2 > _MERGE_ROWS:  # groups hardly repeat: merging no longer pays
                yield from merged.to_batches()
                pending, rows = [], 0
    if pending:
        yield from _sums(pa.concat_tables(pending)).to_batches()


def _per_message(batch: pa.RecordBatch) -> pa.Table:
    timestamps = batch.column("timestamp_us").to_numpy()
    qos = batch.column("qos").to_numpy()
    return pa.table({
        "hour_us": timestamps - timestamps % HOUR_US,
        **{key: batch.column(key) for key in KEYS[1:]},
        "messages": np.ones(batch.num_rows, np.int64),
        "bytes": batch.column("payload_size"),
        **{f"qos{level}": (qos == level).astype(np.int64) for level in range(3)},
    }, schema=SCHEMA)


def _sums(table: pa.Table) -> pa.Table:
    summed = table.group_by(KEYS, use_threads=False).aggregate(
        [(metric, "sum") for metric in METRICS])
    return pa.table([summed.column(f"{m}_sum" if m in METRICS else m) for m in SCHEMA.names],
                    schema=SCHEMA)
