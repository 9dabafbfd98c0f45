"""`mqtt-ds`: the stored messages as a Spark data source, batch and streaming.

    spark.readStream.format("mqtt-ds").option("topicFilter", "fleet/#").load(DATA)
    spark.read.format("mqtt-ds").load(DATA)

DATA is what the jobs take (the broker's node.data_dir, its ds/ or ds/messages/). One
partition per sealed slab (shard x generation), read on executors by slabs.py exactly as
the jobs read them: private copy, verified whole before any row, only the streams the
filter can match, the time range as the scan's key range. A slab that cannot be read fails
the query (naming it): a stream that skipped it would never come back for it. Positions and
admission control are generations.py's.

Options: `topicFilter`, `since`, `until` (ISO 8601), `shard`; streaming also
`maxFilesPerTrigger` (slabs per micro-batch; a slab is one shard's generation). The rows
have the jobs' columns (slabframe.COLUMNS); a schema given with `.schema()` that names
fewer of them is read with only those built. `combine` ("module.function", with `columns`,
the reader's columns it takes, and `.schema()` its output) hands each partition's record
batches to a function that runs in the Python worker, as read_slabs(combine=...) does.
"""

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import generations
import slabs
import ttvarrow
from broker.ds.shard import generation_dir

NAME = "mqtt-ds"
# The frame's columns as the reader builds them; a timestamp crosses as a Spark timestamp
# made from the stored microseconds without a copy (Arrow's cast of int64 is a view).
_TIMESTAMP = pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False)
_READABLE = {f.name: f for f in [*slabs.SCHEMA, ttvarrow.PAYLOAD_SIZE]}


def frame_schema() -> pa.Schema:
    return pa.schema([_TIMESTAMP if f.name == "timestamp_us" else f for f in slabs.SCHEMA])


@dataclass(frozen=True, slots=True)
class _Read:
    """What every partition of a query reads, and how: picklable, shipped to executors."""

    selection: slabs.Selection
    reads: pa.Schema  # the reader's columns (slabs.SCHEMA's, payload_size)
    combine: str | None  # "module.function", or None: rows as read
    output: pa.Schema  # the query's schema as Spark checks it (nullability included)

    def batches(self, task: slabs.SlabTask) -> Iterator[pa.RecordBatch]:
        def fail(skipped: slabs.Skipped) -> None:  # strict below: never called
            raise slabs.SlabError(skipped.reason)

        read = slabs.read_tasks([task], self.selection, True, fail, schema=self.reads)
        if self.combine is not None:
            read = _function(self.combine)(read)
        return (pa.RecordBatch.from_arrays(_as_frame(batch).columns, schema=self.output)
                for batch in read)


def _as_frame(batch: pa.RecordBatch) -> pa.RecordBatch:
    if "timestamp_us" not in batch.schema.names:
        return batch
    index = batch.schema.get_field_index("timestamp_us")
    return batch.set_column(index, _TIMESTAMP, batch.column(index).view(_TIMESTAMP.type))


def _function(name: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    module, _, function = name.rpartition(".")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


class SlabPartition(InputPartition):
    def __init__(self, task: slabs.SlabTask) -> None:
        super().__init__(task)
        self.task = task


class MqttDsDataSource(DataSource):
    """`spark.read[Stream].format("mqtt-ds").load(DATA)`; registered by slabframe.session."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return from_arrow_schema(frame_schema())

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(*self._query(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        limit = self.options.get("maxFilesPerTrigger")
        return StreamReader(*self._query(schema), _integer("maxFilesPerTrigger", limit))

    def _query(self, schema: StructType) -> tuple[Path, _Read]:
        options = self.options
        if "path" not in options:
            raise slabs.ReaderError("mqtt-ds needs the data directory: .load(DATA)")
        selection = slabs.Selection(
            options.get("topicFilter"),
            slabs.parse_time(options["since"]) if "since" in options else None,
            slabs.parse_time(options["until"]) if "until" in options else None,
            _integer("shard", options.get("shard"), minimum=0))
        slabs.check_selection(selection)
        messages = slabs.messages_dir(Path(options["path"]))
        combine = options.get("combine")
        if combine is not None:
            names = [n.strip() for n in options.get("columns", "").split(",") if n.strip()]
        else:
            names = ["timestamp_us" if n == "timestamp" else n for n in schema.fieldNames()]
        if not names:
            raise slabs.ReaderError("mqtt-ds: the combine option needs the columns option")
        unknown = [n for n in names if n not in _READABLE]
        if unknown:
            raise slabs.ReaderError(f"mqtt-ds cannot read column(s) {', '.join(unknown)}: "
                                    f"it reads {', '.join(_columns())}")
        return messages, _Read(selection, pa.schema([_READABLE[n] for n in names]), combine,
                               to_arrow_schema(schema, timezone="UTC"))


def _columns() -> list[str]:
    return [f.name for f in frame_schema()] + [ttvarrow.PAYLOAD_SIZE.name]


def _integer(name: str, value: str | None, minimum: int = 1) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or int(value) < minimum:
        raise slabs.ReaderError(f"mqtt-ds option {name}: not an integer >= {minimum}: {value!r}")
    return int(value)


class BatchReader(DataSourceReader):
    """Every sealed slab that may hold a match, as the jobs plan them; unsealed ones are
    not data yet and are left out, an unreadable manifest fails the read."""

    def __init__(self, messages: Path, read: _Read) -> None:
        self.messages = messages
        self.query = read

    def partitions(self) -> Sequence[InputPartition]:
        tasks, skipped = slabs.plan(self.messages, self.query.selection)
        for problem in skipped:
            if not problem.reason.startswith("unsealed"):
                raise slabs.SlabError(f"{problem.path}: {problem.reason}")
        return [SlabPartition(task) for task in tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlabPartition)
        return self.query.batches(partition.task)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of whole sealed generations. Runs in a Python process on the driver
    for the query's life (partitions, offsets); `read` runs on executors."""

    def __init__(self, messages: Path, read: _Read, max_slabs: int | None) -> None:
        self.messages = messages
        self.query = read
        self.max_slabs = max_slabs
        self.target: dict[int, int] | None = None

    def _shards(self) -> dict[int, generations.ShardListing]:
        return generations.listing(self.messages, self.query.selection.shard)

    def initialOffset(self) -> dict[str, Any]:
        return generations.to_json(generations.initial(self._shards()))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_slabs is None else ReadMaxFiles(self.max_slabs)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {shard: state.sealed for shard, state in self._shards().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if isinstance(limit, ReadMaxFiles):
            max_slabs: int | None = limit.max_files
        elif isinstance(limit, ReadAllAvailable):
            max_slabs = None
        else:
            raise slabs.ReaderError(f"mqtt-ds: unsupported read limit {limit}")
        return generations.to_json(generations.advance(
            generations.from_json(start), self._shards(), max_slabs, self.target))

    def reportLatestOffset(self) -> dict[str, Any]:
        shards = self._shards()
        return generations.to_json({s: (state.oldest, state.sealed) for s, state in shards.items()})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        partitions: list[InputPartition] = []
        for shard, generation in generations.to_read(
                generations.from_json(start), generations.from_json(end)):
            slab_dir = generation_dir(self.messages / f"shard-{shard:03d}", generation)
            if not slab_dir.is_dir():
                raise generations.missing(slab_dir, shard, generation)
            skipped: list[slabs.Skipped] = []
            task = slabs.slab_task(slab_dir, shard, generation, self.query.selection, skipped)
            if skipped:
                raise slabs.SlabError(f"{skipped[0].path}: {skipped[0].reason}")
            if task is not None:
                partitions.append(SlabPartition(task))
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlabPartition)
        return self.query.batches(partition.task)
