"""An archive's manifest: what it holds, at which cut, and a checksum per member (pure).

The manifest is the archive's first member, so a reader learns the cut, the formats and
the generations before any data. Since version 2 the members' sizes and SHA-256 come in a
second, last member, `checksums.json`: an export reads each member once, hashing it as it
ships it (version 1 listed them in the manifest, so the export read everything twice:
once to hash, once to ship). A reader hashes each member as it reads it and compares them
all at the end; an import installs nothing before that. Members besides these:

    sessions.pairs.NNNNNN                   the `sessions` database (pairs encoding), in
                                            parts of whole pairs (version 1: one member,
                                            `sessions.pairs`)
    retained.pairs.NNNNNN                   the retained messages, likewise
    messages/shard-NNN/gen-NNNNNN/FILE      a sealed generation: its LevelDB files as they are
    messages/shard-NNN/gen-NNNNNN.pairs.NNNNNN  a generation not sealed on disk at the cut
                                            (the current one, or one whose seal was under
                                            way), read through a LevelDB snapshot, in parts

A snapshot's size is known only once it is read, and a tar header gives its member's size
first: so a database read through a snapshot goes out in parts of about PART_BYTES, each
held in memory until its header is written.

`generations` lists every generation live at the cut, with `in_archive` false for the sealed
ones an incremental archive (`since_us`) leaves to an earlier one.
"""

import hashlib
import json
import re
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

KIND: Final = "durable-mqtt-backup"
VERSION: Final = 2
_READS: Final = (1, 2)  # version 1: the checksums in the manifest, pairs in one member
NAME: Final = "manifest.json"
CHECKSUMS: Final = "checksums.json"
SESSIONS: Final = "sessions.pairs"
RETAINED: Final = "retained.pairs"
PART_BYTES: Final = 8 << 20
_PART: Final = re.compile(r"\.\d{6}$")
_MEMBER: Final = re.compile(
    r"^((sessions\.pairs|retained\.pairs|messages/shard-\d{3}/gen-\d{6}\.pairs)(\.\d{6})?"
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


def part_path(pairs: str, part: int) -> str:
    """The path of a `.pairs` member's part `part` (version 2)."""
    return f"{pairs}.{part:06d}"


def pairs_of(path: str) -> str | None:
    """The `.pairs` member a member path is (a part of), or None: a generation's file."""
    whole = _PART.sub("", path) if ".pairs." in path else path
    return whole if whole.endswith(".pairs") else None


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
    files: tuple[Member, ...]  # version 2: () until the archive's checksums.json is read
    version: int = VERSION

    @property
    def n_shards(self) -> int:
        return int(self.cluster["n_shards"])

    def to_json(self) -> dict[str, Any]:
        value = {
            "kind": KIND, "version": self.version, "release": self.release,
            "created": self.created, "created_us": self.created_us,
            "since_us": self.since_us, "cluster": self.cluster, "formats": self.formats,
            "cut": self.cut, "generations": [g.to_json() for g in self.generations],
        }
        if self.version == 1:
            value["files"] = [m.to_json() for m in self.files]
        return value

    def encode(self) -> bytes:
        """The manifest member (version 2: without the files, which `encode_checksums`
        lists)."""
        return _encode(self.to_json())


def _encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True).encode()


def encode_checksums(files: list[Member], manifest_raw: bytes) -> bytes:
    """The checksums.json member: every other member's size and SHA-256, and the
    manifest's own (a manifest damaged in the archive is found too)."""
    return _encode({"kind": KIND, "manifest_sha256": hashlib.sha256(manifest_raw).hexdigest(),
                    "files": [m.to_json() for m in files]})


def complete(head: Manifest, head_raw: bytes, raw: bytes) -> Manifest:
    """A version 2 manifest with the files its archive's checksums.json lists (`raw`),
    checked; raises BadManifest."""
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadManifest(f"{CHECKSUMS}: not JSON: {error}") from None
    if not isinstance(value, dict) or value.get("kind") != KIND:
        raise BadManifest(f"{CHECKSUMS}: not a backup's checksums")
    if value.get("manifest_sha256") != hashlib.sha256(head_raw).hexdigest():
        raise BadManifest(f"{NAME}: checksum mismatch: {CHECKSUMS} lists another manifest")
    try:
        manifest = replace(head, files=tuple(_member(entry) for entry in value["files"]))
    except BadManifest:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise BadManifest(f"{CHECKSUMS}: missing or malformed field: {error!r}") from None
    check(manifest)
    return manifest


def parse(raw: bytes) -> Manifest:
    """The manifest, checked as far as it can be alone; raises BadManifest naming the field."""
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadManifest(f"{NAME}: not JSON: {error}") from None
    if not isinstance(value, dict) or value.get("kind") != KIND:
        raise BadManifest(f"{NAME}: not a backup manifest (kind {value.get('kind')!r}"
                          if isinstance(value, dict) else f"{NAME}: not a JSON object")
    version = value.get("version")
    if version not in _READS:
        raise BadManifest(f"{NAME}: version {version!r}; this release reads versions"
                          f" {', '.join(map(str, _READS))}")
    try:
        files = (tuple(_member(entry) for entry in value["files"]) if version == 1
                 else ())
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
            generations, files, version)
        manifest.n_shards  # noqa: B018  (present and a number)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise BadManifest(f"{NAME}: missing or malformed field: {error!r}") from None
    _check_generations(manifest)
    if version == 1:
        check(manifest)
    return manifest


def _member(entry: Any) -> Member:
    member = Member(str(entry["path"]), int(entry["size"]), str(entry["sha256"]))
    if not _MEMBER.match(member.path) or ".." in member.path:
        raise BadManifest(f"{NAME}: member path {member.path!r} is not one an archive holds")
    if member.size < 0 or not _SHA256.match(member.sha256):
        raise BadManifest(f"{NAME}: {member.path}: bad size or sha256")
    return member


def _check_generations(manifest: Manifest) -> None:
    current = {g.shard for g in manifest.generations if g.sealed_at is None}
    if current != set(range(manifest.n_shards)):
        raise BadManifest(f"{NAME}: each of the {manifest.n_shards} shards needs exactly one"
                          f" current generation")
    for g in manifest.generations:
        if not g.in_archive and g.sealed_at is None:
            raise BadManifest(f"{NAME}: {g.path}: a current generation is always in it")


def check(manifest: Manifest) -> None:
    """Its members and generations agree: each generation in the archive has its member(s)
    (a `.pairs` one: a part at least), no member is listed twice, every shard has one
    current generation."""
    paths = [m.path for m in manifest.files]
    if len(set(paths)) != len(paths):
        raise BadManifest(f"{NAME}: a member is listed twice")
    listed = set(paths) | {pairs for pairs in map(pairs_of, paths) if pairs is not None}
    for required in (SESSIONS, RETAINED):
        if required not in listed:
            raise BadManifest(f"{NAME}: no {required} listed")
    _check_generations(manifest)
    for g in manifest.generations:
        if not g.in_archive:
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
