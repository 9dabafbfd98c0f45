"""An archive's manifest: what it holds, at which cut, and a checksum per member (pure).

The manifest is the archive's first member, so a reader learns every member's size and
SHA-256 before it reads any, and an import can check them all before it changes anything.
Members besides it:

    sessions.pairs                          the `sessions` database (pairs.py encoding)
    retained.pairs                          the retained messages
    messages/shard-NNN/gen-NNNNNN/FILE      a sealed generation: its LevelDB files as they are
    messages/shard-NNN/gen-NNNNNN.pairs     a generation not sealed on disk at the cut (the
                                            current one, or one whose seal was under way),
                                            read through a LevelDB snapshot

`generations` lists every generation live at the cut, with `in_archive` false for the sealed
ones an incremental archive (`since_us`) leaves to an earlier one.
"""

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

KIND: Final = "durable-mqtt-backup"
VERSION: Final = 1
NAME: Final = "manifest.json"
SESSIONS: Final = "sessions.pairs"
RETAINED: Final = "retained.pairs"
_MEMBER: Final = re.compile(
    r"^(sessions\.pairs|retained\.pairs"
    r"|messages/shard-\d{3}/gen-\d{6}\.pairs"
    r"|messages/shard-\d{3}/gen-\d{6}/[A-Za-z0-9_.\-]+)$")
_SHA256: Final = re.compile(r"^[0-9a-f]{64}$")


class BadManifest(ValueError):
    """The manifest is not one this release reads, or contradicts itself."""


@dataclass(frozen=True, slots=True)
class Member:
    path: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class Generation:
    """A generation live at the cut. `sealed_at` None: the shard's current one. `files`:
    stored as its LevelDB files (sealed on disk), else as `<dir>.pairs`."""

    shard: int
    generation: int
    created: int
    sealed_at: int | None
    files: bool
    in_archive: bool = True

    @property
    def path(self) -> str:
        return generation_path(self.shard, self.generation)

    def to_json(self) -> dict[str, Any]:
        return {"shard": self.shard, "generation": self.generation, "created": self.created,
                "sealed_at": self.sealed_at, "files": self.files,
                "in_archive": self.in_archive}


def generation_path(shard: int, generation: int) -> str:
    return f"messages/shard-{shard:03d}/gen-{generation:06d}"


@dataclass(frozen=True, slots=True)
class Manifest:
    release: str
    created: str  # RFC 3339, UTC
    created_us: int
    since_us: int | None
    cluster: dict[str, Any]  # site, sites, backend, n_shards, placement, thresholds
    formats: dict[str, int]  # format name -> version (broker/formats.py)
    cut: dict[str, int | None]  # group name -> Raft applied index (None: not replicated)
    generations: tuple[Generation, ...]
    files: tuple[Member, ...]

    @property
    def n_shards(self) -> int:
        return int(self.cluster["n_shards"])

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KIND, "version": VERSION, "release": self.release,
            "created": self.created, "created_us": self.created_us,
            "since_us": self.since_us, "cluster": self.cluster, "formats": self.formats,
            "cut": self.cut, "generations": [g.to_json() for g in self.generations],
            "files": [m.to_json() for m in self.files],
        }

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode()


def parse(raw: bytes) -> Manifest:
    """The manifest, checked as far as it can be alone; raises BadManifest naming the field."""
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadManifest(f"{NAME}: not JSON: {error}") from None
    if not isinstance(value, dict) or value.get("kind") != KIND:
        raise BadManifest(f"{NAME}: not a backup manifest (kind {value.get('kind')!r}"
                          if isinstance(value, dict) else f"{NAME}: not a JSON object")
    if value.get("version") != VERSION:
        raise BadManifest(f"{NAME}: version {value.get('version')!r}; this release reads"
                          f" version {VERSION}")
    try:
        files = tuple(_member(entry) for entry in value["files"])
        generations = tuple(
            Generation(int(g["shard"]), int(g["generation"]), int(g["created"]),
                       None if g["sealed_at"] is None else int(g["sealed_at"]),
                       bool(g["files"]), bool(g.get("in_archive", True)))
            for g in value["generations"])
        manifest = Manifest(
            str(value["release"]), str(value["created"]), int(value["created_us"]),
            None if value["since_us"] is None else int(value["since_us"]),
            dict(value["cluster"]), {str(k): int(v) for k, v in value["formats"].items()},
            {str(k): (None if v is None else int(v)) for k, v in value["cut"].items()},
            generations, files)
        manifest.n_shards  # noqa: B018  (present and a number)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise BadManifest(f"{NAME}: missing or malformed field: {error!r}") from None
    check(manifest)
    return manifest


def _member(entry: Any) -> Member:
    member = Member(str(entry["path"]), int(entry["size"]), str(entry["sha256"]))
    if not _MEMBER.match(member.path) or ".." in member.path:
        raise BadManifest(f"{NAME}: member path {member.path!r} is not one an archive holds")
    if member.size < 0 or not _SHA256.match(member.sha256):
        raise BadManifest(f"{NAME}: {member.path}: bad size or sha256")
    return member


def check(manifest: Manifest) -> None:
    """Its members and generations agree: each generation in the archive has its member(s),
    no member is listed twice, every shard has one current generation."""
    paths = [m.path for m in manifest.files]
    if len(set(paths)) != len(paths):
        raise BadManifest(f"{NAME}: a member is listed twice")
    listed = set(paths)
    for required in (SESSIONS, RETAINED):
        if required not in listed:
            raise BadManifest(f"{NAME}: no {required} listed")
    current = {g.shard for g in manifest.generations if g.sealed_at is None}
    if current != set(range(manifest.n_shards)):
        raise BadManifest(f"{NAME}: each of the {manifest.n_shards} shards needs exactly one"
                          f" current generation")
    for g in manifest.generations:
        if not g.in_archive:
            if g.sealed_at is None:
                raise BadManifest(f"{NAME}: {g.path}: a current generation is always in it")
            continue
        if g.files:
            if not any(p.startswith(g.path + "/") for p in listed):
                raise BadManifest(f"{NAME}: {g.path}: no files listed")
        elif g.path + ".pairs" not in listed:
            raise BadManifest(f"{NAME}: {g.path}.pairs not listed")


def parse_time(text: str) -> int:
    """A point in time as microseconds since the epoch: an integer (microseconds) or RFC
    3339 (`2026-12-06T12:00:00Z`)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r}: not microseconds nor an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise ValueError(f"{text!r}: an RFC 3339 time needs its offset (Z for UTC)")
    return int(moment.timestamp() * 1_000_000)


def unreadable_formats(manifest: Manifest, readable: dict[str, int]) -> list[str]:
    """The formats the archive's data has at versions this release does not read."""
    return [f"{name} version {version} (this release reads up to {readable.get(name)})"
            for name, version in sorted(manifest.formats.items())
            if name in readable and version > readable[name]]
