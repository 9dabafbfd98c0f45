"""The start-up check of a node's formats, before anything is opened for writing.

`inspect` reads every stamp (broker/formats.py) and the head of every write-ahead log
segment, and changes nothing: a format newer than this release reads, a cluster version
this code does not run (the data dir's stamp records the one its cluster rose to:
`record_cluster_version`), a stamp that is not ours, or a segment that is not one is
refused with `FormatRefused`, naming the file, the version and the release that reads it.
Only then does `upgrade` bring older trees to this release's versions. Today that is the
migration 0 -> 1 of a 0.1.0 tree, which only writes its stamp; a migration that rewrites
data would run before the stamp it leads to is written, so a crash at any point leaves the
old stamp and the migration runs again (it must be idempotent). Each stamp is written to a
temporary file, fsync'd and renamed, so a crash leaves the old stamp (or none) or the new
one, never half of one.
"""

import json
import logging
from pathlib import Path
from typing import Any, Final, NamedTuple

from broker.cluster import versions as cluster_versions
from broker.config.loader import Config
from broker.ds.files import write_all_atomically, write_atomically
from broker.formats import (
    DATA_DIR,
    STAMP,
    STAMP_KIND,
    WAL,
    WAL_DIR,
    WAL_SEGMENT_MAGIC,
    Format,
    in_tree,
    stamp_of,
)
from broker.raft.wal import SUFFIX as WAL_SUFFIX
from broker.version import RELEASE

log = logging.getLogger(__name__)

_HEADER_SIZE: Final = len(WAL_SEGMENT_MAGIC) + 1


class FormatRefused(Exception):
    """The node cannot run on these files: nothing was changed."""


class Found(NamedTuple):
    """A format as a tree's stamp records it (version 0: the tree has no stamp)."""

    fmt: Format
    version: int
    stamp: Path


def inspect(data_dir: Path, wal_dir: Path) -> list[Found]:
    """Read-only: the version of every format in both trees; raises FormatRefused for one
    this release cannot read."""
    found: list[Found] = []
    for tree, root in ((DATA_DIR, data_dir), (WAL_DIR, wal_dir)):
        versions = _read_stamp(root / STAMP, tree)
        found += [Found(fmt, versions.get(fmt.name, 0), root / STAMP) for fmt in in_tree(tree)]
        for fmt in in_tree(tree):
            for pattern in fmt.files:
                for path in sorted(root.glob(pattern)):
                    _check_file(path, fmt)
    wal_stamp = next(item for item in found if item.fmt is WAL)
    _check_segments(wal_dir, wal_stamp)
    return found


def upgrade(data_dir: Path, wal_dir: Path, found: list[Found]) -> list[tuple[Path, str]]:
    """Brings every tree older than this release up to it (stamps it); returns what it did
    (stamp, formats), for the log. `found` is what `inspect` answered."""
    done, stamps = [], {}
    for tree, root in ((DATA_DIR, data_dir), (WAL_DIR, wal_dir)):
        old = [item for item in found if item.fmt.tree == tree
               and item.version < item.fmt.version]
        if not old:
            continue
        root.mkdir(parents=True, exist_ok=True)
        stamps[root / STAMP] = _stamp_bytes({**stamp_of(tree), **_cluster_entry(root / STAMP)})
        done.append((root / STAMP, ", ".join(
            f"{item.fmt.name} {item.version}->{item.fmt.version}" for item in old)))
    # Both trees' stamps side by side (the first start of a node writes both): each is
    # whole or absent after a crash, and a tree left unstamped is stamped at the next start.
    write_all_atomically(stamps)
    return done


def open_formats(config: Config) -> None:
    """The start-up check, then the upgrade (see the module's docstring)."""
    data_dir, wal_dir = trees(config)
    for stamp, changes in upgrade(data_dir, wal_dir, inspect(data_dir, wal_dir)):
        log.info("formats upgraded to release %s (%s): %s", RELEASE, stamp, changes)


def record_cluster_version(data_dir: Path, version: int) -> None:
    """Blocking: the cluster's effective version, once it rose above the one the data dir's
    stamp records, written into that stamp. The version never falls, so code that cannot
    run it must not run on this data dir: it would skip the entries of the kinds the
    version introduced as it replays them; `inspect` refuses it before then. (A crash
    between applying a rise and recording it leaves the older version, until this code
    starts again and records it.)"""
    path = data_dir / STAMP
    doc = json.loads(path.read_bytes()) if path.exists() else stamp_of(DATA_DIR)
    if doc.get("cluster", {}).get("version", 0) >= version:
        return
    doc["cluster"] = {"version": version, "run_by": cluster_versions.RUN_BY[version]}
    write_atomically(path, _stamp_bytes(doc))


def _cluster_entry(path: Path) -> dict[str, Any]:
    """{"cluster": ...} of a stamp (checked by `inspect`) that records one, else {}."""
    try:
        cluster = json.loads(path.read_bytes()).get("cluster")
    except FileNotFoundError:
        return {}
    return {"cluster": cluster} if cluster is not None else {}


def _stamp_bytes(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=1).encode()


def trees(config: Config) -> tuple[Path, Path]:
    """The node's data dir and write-ahead log dir."""
    data_dir = Path(config["node.data_dir"])
    return data_dir, wal_dir_of(data_dir, config["durable_storage.raft.wal_dir"])


def wal_dir_of(data_dir: Path, configured: str = "") -> Path:
    """durable_storage.raft.wal_dir: empty = `<data dir>/raft/wal`."""
    return Path(configured) if configured else data_dir / "raft" / "wal"


def _read_stamp(path: Path, tree: str) -> dict[str, int]:
    """name -> version; empty when there is no stamp (0.1.0 wrote none)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise FormatRefused(f"{path}: cannot read the format stamp: {error.strerror}") from None
    doc = _parse_stamp(path, raw)
    _check_cluster_version(path, doc, tree)
    known = {fmt.name: fmt for fmt in in_tree(tree)}
    versions = {}
    for name, entry in doc["formats"].items():
        version, read_by = entry["version"], entry["read_by"]
        fmt = known.get(name)
        if fmt is None or version > fmt.version:
            what = (f"format {name} ({fmt.where})" if fmt is not None
                    else f"format {name}, which this release does not know,")
            raise FormatRefused(
                f"{path}: {what} is version {version}, which release {read_by} and later"
                f" read; this is release {RELEASE}"
                + (f", which reads up to version {fmt.version}" if fmt is not None else "")
                + f". Run release {read_by} or later on this {tree}; nothing was changed")
        versions[name] = version
    return versions


def _check_cluster_version(path: Path, doc: dict[str, Any], tree: str) -> None:
    """Refuses a data dir whose cluster runs a version this code cannot run
    (`record_cluster_version`)."""
    cluster = doc.get("cluster")
    if cluster is None or cluster["version"] <= cluster_versions.HIGHEST:
        return
    run_by = cluster["run_by"]
    raise FormatRefused(
        f"{path}: this node's cluster runs cluster version {cluster['version']}, which"
        f" release {run_by} and later run; this is release {RELEASE}, which runs up to"
        f" version {cluster_versions.HIGHEST} (a cluster's version never falls). Run release"
        f" {run_by} or later on this {tree}; nothing was changed")


def _parse_stamp(path: Path, raw: bytes) -> dict[str, Any]:
    """The stamp's JSON, checked to be one of ours (every field `_read_stamp` reads)."""
    def foreign(reason: str) -> FormatRefused:
        return FormatRefused(
            f"{path}: not a format stamp of this broker ({reason}). It was damaged or"
            " written by something else: restore it (every release since 0.2.0 writes it),"
            " or move it away if this directory was last run by release 0.1.0; nothing was"
            " changed")

    try:
        doc = json.loads(raw)
    except ValueError as error:
        raise foreign(f"not JSON: {error}") from None
    if not isinstance(doc, dict) or doc.get("kind") != STAMP_KIND:
        raise foreign(f"no \"kind\": \"{STAMP_KIND}\"")
    formats = doc.get("formats")
    if not isinstance(formats, dict) or not all(
            isinstance(entry, dict) and type(entry.get("version")) is int
            and entry["version"] >= 0 and isinstance(entry.get("read_by"), str)
            for entry in formats.values()):
        raise foreign("\"formats\" is not a map of {\"version\": int, \"read_by\": release}")
    cluster = doc.get("cluster", {"version": 0, "run_by": ""})
    if not (isinstance(cluster, dict) and type(cluster.get("version")) is int
            and cluster["version"] >= 0 and isinstance(cluster.get("run_by"), str)):
        raise foreign("\"cluster\" is not {\"version\": int, \"run_by\": release}")
    return doc


def _check_file(path: Path, fmt: Format) -> None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as error:
        raise FormatRefused(f"{path}: cannot read: {error.strerror}") from None
    try:
        text = raw.decode()
        if path.suffix == ".json":
            if not isinstance(json.loads(text), dict):
                raise ValueError("not a JSON object")
        elif not text.strip() or "\n" in text.strip():
            raise ValueError("not one line of text")
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError too
        raise FormatRefused(
            f"{path}: not the file of format {fmt.name} this broker writes ({error}). It was"
            " damaged or written by something else: restore it; nothing was changed"
        ) from None


def _check_segments(wal_dir: Path, stamp: Found) -> None:
    """Every segment starts with the header of a version this release reads. Only the
    last may be shorter than a header: a crash right after creating it (recovery removes
    it)."""
    try:
        names = sorted(p.name for p in wal_dir.iterdir() if p.name.endswith(WAL_SUFFIX))
    except FileNotFoundError:
        return
    except OSError as error:
        raise FormatRefused(f"{wal_dir}: cannot list the write-ahead log: {error.strerror}"
                            ) from None
    for position, name in enumerate(names):
        path = wal_dir / name
        head = _head(path)
        if len(head) < _HEADER_SIZE and position == len(names) - 1:
            continue
        if len(head) < _HEADER_SIZE:
            problem = f"is {len(head)} bytes, shorter than a segment's header"
        elif (not head.startswith(WAL_SEGMENT_MAGIC) or not head[-1:].isdigit()
              or head[-1:] == b"0"):
            problem = f"does not start with {WAL_SEGMENT_MAGIC.decode()}<version> ({head!r})"
        elif int(head[-1:]) > WAL.version:
            raise FormatRefused(
                f"{path}: a write-ahead log segment of version {int(head[-1:])}; this is"
                f" release {RELEASE}, which reads up to version {WAL.version}"
                f" (stamp {stamp.stamp}: version {stamp.version}); nothing was changed")
        else:
            continue
        raise FormatRefused(f"{path}: not a write-ahead log segment: it {problem};"
                            " nothing was changed")


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as file:
            return file.read(_HEADER_SIZE)
    except OSError as error:
        raise FormatRefused(f"{path}: cannot read: {error.strerror}") from None
