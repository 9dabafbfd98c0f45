"""Sealed slabs as rows, without Spark: finding them, copying them, reading them.

Everything a Spark executor runs lives here so it can be unit-tested without a JVM. The
slab format is not re-implemented: slabs are opened with `broker.ds.slab.Slab` and scanned
with `broker.ds.keys` (the Spark image installs this project); values are decoded in bulk
by ttvarrow, which is tested against `broker.ds.ttv`.

Reading while the broker runs: LevelDB lets one process open a directory, and the broker
keeps every live slab open. A sealed slab's files are immutable once its manifest exists (it
was compacted before the manifest was written), so each slab is copied to a private temp
dir on the executor and opened there. The copy is checked against the slab's CURRENT file,
which changes only if the broker reopened the slab meanwhile (a restart writes a new
LevelDB MANIFEST); then it is copied again. The broker's files are only ever read.
"""

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import plyvel
import pyarrow as pa

import ttvarrow
from broker.ds import keys
from broker.ds.db import DB_FILE
from broker.ds.iterator import read_plan
from broker.ds.lts import LTS
from broker.ds.manifest import read_manifest
from broker.ds.slab import SPARE_FILE, Slab
from broker.ds.storage import MESSAGES
from broker.mqtt.errors import ProtocolError
from broker.mqtt.topic import topic_matches, validate_topic_filter

# One row per message, in this order: the message's columns, then where it is stored.
# `timestamp_us` becomes a Spark timestamp on the JVM side (exact to the microsecond, and
# cheaper than building datetimes in Python).
SCHEMA = pa.schema([
    *ttvarrow.FIELDS,
    ("shard", pa.int32()), ("generation", pa.int32()), ("stream", pa.int32()),
    ("structure", pa.string()),
])
SUPPORTED_FORMATS = {"format": 1, "key_format": 2, "value_format": 1}
_BATCH = 8192  # rows per Arrow batch: large enough that per-batch costs vanish
_TOPIC = ttvarrow.FIELDS[0]
_PAST_TIMESTAMPS = b"\xff" * (keys.TIMESTAMP_SIZE + 1)  # sorts after every key of a prefix
_HELD_BYTES = 256 << 20  # decoded batches held while their slab is checked in the same pass
_COPY_ATTEMPTS = 3
_CURRENT = "CURRENT"
_LOCK = "LOCK"


class ReaderError(Exception):
    """A problem with the job's input as a whole: reported as one line, exit status 2."""


class SlabError(Exception):
    """One slab cannot be read; skipped and reported, or fatal with --strict."""


@dataclass(frozen=True, slots=True)
class Selection:
    topic_filter: str | None = None  # None: every message, `$` topics too (unlike "#")
    since: int | None = None  # microseconds, inclusive
    until: int | None = None  # microseconds, exclusive
    shard: int | None = None
    generation: int | None = None


@dataclass(frozen=True, slots=True)
class SlabTask:
    """What an executor needs to read one sealed slab: the streams that may match."""

    path: str
    shard: int
    generation: int
    messages: int
    streams: tuple[tuple[int, str], ...]  # (stream id, structure such as "metrics/+/cpu")


@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    shard: int
    generation: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "shard": self.shard, "generation": self.generation,
                "reason": self.reason}


def parse_time(text: str) -> int:
    """ISO 8601 (a time without an offset is UTC) -> microseconds since the epoch."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ReaderError(f"not an ISO 8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def check_selection(selection: Selection) -> None:
    topic_filter = selection.topic_filter
    if topic_filter is not None:
        try:
            validate_topic_filter(topic_filter)
        except ProtocolError as error:
            raise ReaderError(str(error)) from None
        if topic_filter.startswith("$share/"):
            raise ReaderError("a shared subscription is not a topic filter")
    since, until = selection.since, selection.until
    if since is not None and until is not None and since >= until:
        raise ReaderError("--since must be before --until")


def messages_dir(path: Path) -> Path:
    """Accepts the broker's data dir (node.data_dir), its ds/ dir or the messages DB dir,
    so a volume can be mounted at any of those levels."""
    if not path.exists():
        raise ReaderError(f"no such path: {path}")
    for candidate in (path, path / MESSAGES, path / "ds" / MESSAGES):
        if (candidate / DB_FILE).is_file():
            return candidate
    raise ReaderError(f"no Durable Storage messages database in {path} (no {DB_FILE})")


def _overlaps(manifest: dict[str, Any], selection: Selection) -> bool:
    if not manifest["messages"]:
        return False
    if selection.since is not None and manifest["max_timestamp"] < selection.since:
        return False
    return selection.until is None or manifest["min_timestamp"] < selection.until


def plan(path: Path, selection: Selection) -> tuple[list[SlabTask], list[Skipped]]:
    """The sealed slabs to read (only manifests are opened, on the driver), and those
    skipped: unsealed (no manifest yet) or with an unreadable manifest. Slabs that cannot
    hold a match (time range, shard, generation, topic structure) are simply left out."""
    check_selection(selection)
    tasks: list[SlabTask] = []
    skipped: list[Skipped] = []
    for shard, shard_dir in shard_dirs(messages_dir(path), selection.shard):
        for generation, slab_dir in slab_dirs(shard_dir):
            if selection.generation is not None and generation != selection.generation:
                continue
            found = slab_task(slab_dir, shard, generation, selection, skipped)
            if found is not None:
                tasks.append(found)
    return tasks, skipped


def shard_dirs(messages: Path, only: int | None = None) -> Iterator[tuple[int, Path]]:
    """(shard, directory) of the messages database `messages`, in shard order."""
    for shard_dir in sorted(messages.glob("shard-*")):
        number = shard_dir.name.removeprefix("shard-")
        if not number.isdigit():
            continue  # a Raft snapshot on its way in or out (replication_shard.py): no slabs
        if only is None or int(number) == only:
            yield int(number), shard_dir


def slab_dirs(shard_dir: Path) -> list[tuple[int, Path]]:
    """(generation, directory) of a shard's slabs, sealed or not, in generation order."""
    return sorted((int(slab_dir.name.removeprefix("gen-")), slab_dir)
                  for slab_dir in shard_dir.glob("gen-*")
                  # a slab being created, or made ahead of its generation (shard.py)
                  if not slab_dir.name.endswith(".tmp") and not (slab_dir / SPARE_FILE).exists())


def slab_task(
    slab_dir: Path, shard: int, generation: int, selection: Selection, skipped: list[Skipped]
) -> SlabTask | None:
    """What to read of one slab, None if it cannot hold a match (or was skipped: then
    `skipped` says why)."""
    def skip(reason: str) -> None:
        skipped.append(Skipped(str(slab_dir), shard, generation, reason))

    try:
        manifest = read_manifest(slab_dir)
        if manifest is None:
            skip("unsealed (no manifest.json yet)")
            return None
        unsupported = [k for k, v in SUPPORTED_FORMATS.items() if manifest.get(k) != v]
        if unsupported:
            skip(f"corrupt: unsupported {', '.join(unsupported)} in manifest.json")
            return None
        if not _overlaps(manifest, selection):
            return None
        structures = {s["id"]: s["structure"] for s in manifest["streams"]}
        topic_filter = selection.topic_filter
        streams = list(structures) if topic_filter is None else LTS.from_json(
            manifest["lts"]).match(topic_filter)
        return SlabTask(str(slab_dir), shard, generation, manifest["messages"],
                        tuple((s, structures[s]) for s in sorted(streams))) if streams else None
    except (ValueError, KeyError, TypeError, OSError) as error:
        skip(f"corrupt: manifest.json unreadable ({type(error).__name__}: {error})")
        return None


def snapshot(source: Path, target: Path) -> None:
    """Copies a slab's files (not its LOCK) to `target`, retrying if the broker reopened
    the slab meanwhile."""
    for _ in range(_COPY_ATTEMPTS):
        try:
            current = (source / _CURRENT).read_bytes()
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            with os.scandir(source) as entries:
                for entry in entries:
                    if entry.name != _LOCK and entry.is_file():
                        shutil.copyfile(entry.path, target / entry.name)
            if (source / _CURRENT).read_bytes() == current:
                return
        except FileNotFoundError:
            if not source.exists():
                raise SlabError("vanished: dropped by retention while being read") from None
    raise SlabError(f"changed while being copied, {_COPY_ATTEMPTS} times")


def _verify(slab: Slab, task: SlabTask) -> None:
    """Reads every stored message's block with checksums on, and counts them against the
    manifest: a slab is read whole or not at all, so a damaged one yields no rows."""
    counted = 0
    for stream in slab.lts.streams():
        for _ in slab.db.iterator(prefix=keys.master_prefix(stream), include_value=False,
                                  verify_checksums=True, fill_cache=False):
            counted += 1
    _check_count(slab, task, counted)


def _check_count(slab: Slab, task: SlabTask, counted: int) -> None:
    if counted != task.messages or slab.stats.messages != task.messages:
        raise SlabError(f"corrupt: {counted} messages stored, the manifest says {task.messages}")


@contextmanager
def _corrupt_if_unreadable() -> Iterator[None]:
    try:
        yield
    except (plyvel.Error, ValueError, OSError) as error:
        raise SlabError(f"corrupt: {type(error).__name__}: {error}") from None


@contextmanager
def opened(task: SlabTask, tmp_root: str | None = None) -> Iterator[Slab]:
    """A private copy of a sealed slab, open, and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="slab-", dir=tmp_root) as tmp:
        copy = Path(tmp) / "slab"
        snapshot(Path(task.path), copy)
        with _corrupt_if_unreadable():
            slab = Slab.open(copy, task.generation)
            slab.reopen()  # a sealed slab opens closed (the broker opens them on demand)
        try:
            yield slab
        finally:
            slab.close()


def verified_batches(
    slab: Slab, task: SlabTask, selection: Selection, schema: pa.Schema = SCHEMA
) -> Iterator[pa.RecordBatch]:
    """`batches`, none of them before the whole slab is known to be sound. A selection
    that reads every message is read, checked (LevelDB checksums, the count) and held in
    one pass, up to _HELD_BYTES of batches; any other, or one that outgrows that, is
    preceded by a pass that only checks (it costs as much as reading the values)."""
    stats = slab.stats
    if selection.topic_filter is None and (selection.since or 0) <= stats.min_timestamp \
            and (selection.until is None or selection.until > stats.max_timestamp):
        with _corrupt_if_unreadable():
            held = _read_and_check(slab, task, selection, schema)
        if held is not None:
            yield from held
            return
    with _corrupt_if_unreadable():
        _verify(slab, task)
    yield from batches(slab, task, selection, schema)


def _read_and_check(
    slab: Slab, task: SlabTask, selection: Selection, schema: pa.Schema
) -> list[pa.RecordBatch] | None:
    """Every batch of a selection that reads all messages, once they are all read and
    counted; None if they outgrow _HELD_BYTES."""
    held: list[pa.RecordBatch] = []
    size = 0
    for batch in batches(slab, task, selection, schema):
        held.append(batch)
        size += batch.nbytes
        if size > _HELD_BYTES:
            return None
    _check_count(slab, task, sum(batch.num_rows for batch in held))
    return held


def batches(
    slab: Slab, task: SlabTask, selection: Selection, schema: pa.Schema = SCHEMA
) -> Iterator[pa.RecordBatch]:
    """Record batches of the selected streams, each stream in time order, with the columns
    of `schema` (a selection of SCHEMA's fields: a job builds and ships only what it uses).
    The time range is the scan's own key range; a filter that the stream's structure does
    not settle is matched once per distinct topic of a batch."""
    topic_filter = selection.topic_filter
    decoded = [f for f in schema if ttvarrow.decodes(f.name)]
    for stream, structure in task.streams:
        accept = None
        if topic_filter is not None and not read_plan(
                tuple(structure.split("/")), topic_filter).exact:
            accept = partial(topic_matches, topic_filter)
        prefix = keys.master_prefix(stream)
        values = slab.db.iterator(
            start=prefix + keys.pack_u64(selection.since or 0), include_key=False,
            verify_checksums=True, fill_cache=False,
            stop=prefix + (_PAST_TIMESTAMPS if selection.until is None
                           else keys.pack_u64(selection.until)))
        constants = {"shard": task.shard, "generation": task.generation, "stream": stream,
                     "structure": structure}
        fields = decoded if accept is None or _TOPIC in decoded else [_TOPIC, *decoded]
        while chunk := list(islice(values, _BATCH)):
            columns = dict(zip((f.name for f in fields), ttvarrow.decode(chunk, fields),
                               strict=True))
            n = len(chunk)
            if accept is not None:
                keep = _matching(columns[_TOPIC.name], accept)
                columns = {name: column.filter(keep) for name, column in columns.items()}
                n = len(columns[_TOPIC.name])
            if n:
                yield pa.RecordBatch.from_arrays([
                    columns[f.name] if f.name in columns
                    else pa.repeat(pa.scalar(constants[f.name], f.type), n) for f in schema
                ], schema=schema)


def _matching(topics: pa.Array, accept: Callable[[str], bool]) -> pa.Array:
    """Which rows' topics `accept` takes, calling it once per distinct topic."""
    encoded = topics.dictionary_encode()
    matches = pa.array([accept(topic) for topic in encoded.dictionary.to_pylist()], pa.bool_())
    return matches.take(encoded.indices)


def read_tasks(
    tasks: Iterable[SlabTask], selection: Selection, strict: bool,
    report: Callable[[Skipped], None], tmp_root: str | None = None,
    schema: pa.Schema = SCHEMA,
) -> Iterator[pa.RecordBatch]:
    """An executor's partition: the record batches of each slab; a slab that cannot be
    read is reported and skipped, or raises with `strict`."""
    for task in tasks:
        try:
            with opened(task, tmp_root) as slab:
                yield from verified_batches(slab, task, selection, schema)
        except SlabError as error:
            if strict:
                raise SlabError(f"{task.path}: {error}") from None
            report(Skipped(task.path, task.shard, task.generation, str(error)))
