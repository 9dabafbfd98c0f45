"""The pure parts of backups: the manifest (build, parse, check) and the archive's stream
format (tar members with a SHA-256 each, pairs), read back and checked member by member."""

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import IO

import pytest

from broker.backup.archive import (
    CHUNK,
    BadArchive,
    TarWriter,
    decode_pairs,
    encode_pairs,
    parts,
    verify,
)
from broker.backup.hashing import Hasher, Hashing
from broker.backup.manifest import (
    CHECKSUMS,
    NAME,
    PART_BYTES,
    RETAINED,
    SESSIONS,
    BadManifest,
    Generation,
    Manifest,
    Member,
    encode_checksums,
    pairs_of,
    parse,
    parse_time,
    unreadable_formats,
)
from broker.backup.stream_check import StreamCheck

# What an export writes (version 2): a database read through a snapshot in parts.
DATA = {"sessions.pairs.000000": b"s" * 1000, "retained.pairs.000000": b"",
        "messages/shard-000/gen-000001/000005.ldb": bytes(range(256)) * 9,
        "messages/shard-000/gen-000002.pairs.000000": b"pa",
        "messages/shard-000/gen-000002.pairs.000001": b"irs"}
# What version 1 wrote: each in one member.
DATA_V1 = {SESSIONS: b"s" * 1000, RETAINED: b"",
           "messages/shard-000/gen-000001/000005.ldb": bytes(range(256)) * 9,
           "messages/shard-000/gen-000002.pairs": b"pairs"}
GENERATIONS = (Generation(0, 1, 10, 20, True), Generation(0, 2, 20, None, False))


def digest(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()


def members(data: dict[str, bytes]) -> tuple[Member, ...]:
    return tuple(Member(path, *digest(content)) for path, content in data.items())


def manifest(files: tuple[Member, ...] | None = None, since: int | None = None,
             generations: tuple[Generation, ...] = GENERATIONS, version: int = 2) -> Manifest:
    """The manifest of `archive()` (version 2: with the files its checksums.json lists)."""
    if files is None:
        files = members(DATA if version == 2 else DATA_V1)
    return Manifest("0.2.0", "2026-12-06T12:00:00Z", 1, since,
                    {"n_shards": 1, "site": "a"}, {"messages": 1}, {"metadata": 4},
                    generations, files, version)


def archive(gzip: bool = False, data: dict[str, bytes] | None = None,
            listed: Manifest | None = None, version: int = 2) -> bytes:
    """An archive of `data` as `listed` lists it (default: as it is), in `version`'s layout:
    2, the manifest first and checksums.json last; 1, the manifest with the files first."""
    data = (DATA if version == 2 else DATA_V1) if data is None else data
    listed = listed or manifest(members(data), version=version)
    out = io.BytesIO()
    writer = TarWriter(out.write, gzip)
    raw = listed.encode()
    writer.add(NAME, len(raw), [raw])
    for path, content in data.items():
        writer.add(path, len(content), [content[:100], content[100:]])
    if version == 2:
        checksums = encode_checksums(list(listed.files), raw)
        writer.add(CHECKSUMS, len(checksums), [checksums])
    writer.close()
    assert writer.bytes == len(out.getvalue())
    return out.getvalue()


class _Stream:
    """An archive as an HTTP response gives it: only `read` (tarfile reads it as a stream;
    a file on disk it reads as a file)."""

    def __init__(self, raw: bytes) -> None:
        self._file = io.BytesIO(raw)

    def read(self, size: int = -1) -> bytes:
        return self._file.read(size)


def _pushed(raw: bytes, hashed_aside: bool = False) -> Manifest:
    """As `broker ctl data export` checks an archive arriving: pushed in pieces of odd
    sizes, across headers and members (with `hashed_aside`, hashed on a thread of its
    own, each piece a copy the caller drops once hashed)."""
    with ThreadPoolExecutor(1) as hasher:
        check = StreamCheck(hasher if hashed_aside else None)
        for at in range(0, len(raw), 333):
            piece = bytearray(raw[at:at + 333])
            check.feed(piece)
            check.settle()
            piece[:] = bytes(len(piece))  # what the caller reads next into its buffer
        return check.finish()


@pytest.fixture(params=["file", "stream", "pushed", "pushed-hashed-aside"])
def checked(request: pytest.FixtureRequest) -> Callable[[bytes], Manifest]:
    """An archive's bytes checked whole (archive.verify of a file or a stream, or
    StreamCheck): its manifest, or BadArchive."""
    if request.param.startswith("pushed"):
        return lambda raw: _pushed(raw, request.param == "pushed-hashed-aside")
    opened: Callable[[bytes], IO[bytes]] = (
        io.BytesIO if request.param == "file" else _Stream)  # type: ignore[assignment]
    return lambda raw: verify(opened(raw))


def test_manifest_round_trip() -> None:
    made = manifest(version=1)
    assert parse(made.encode()) == made
    assert json.loads(made.encode())["kind"] == "durable-mqtt-backup"
    head = manifest()  # version 2: the files are in checksums.json, not in the manifest
    assert parse(head.encode()) == replace(head, files=())
    assert "files" not in json.loads(head.encode())


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("gzip", [False, True])
def test_archive_is_a_tar_that_verifies(gzip: bool, version: int) -> None:
    raw = archive(gzip, version=version)
    made = manifest(version=version)
    assert verify(io.BytesIO(raw)) == verify(_Stream(raw)) == made
    if not gzip:  # what a node sends, as `broker ctl data export` checks it arriving
        assert _pushed(raw) == made
    data = DATA if version == 2 else DATA_V1
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        assert tar.getnames() == [NAME, *data, *([CHECKSUMS] if version == 2 else [])]
        first = next(iter(data))
        assert tar.extractfile(first).read() == data[first]  # type: ignore[union-attr]


def test_a_damaged_manifest_is_found_by_its_checksum(
        checked: Callable[[bytes], Manifest]) -> None:
    raw = bytearray(archive())
    at = raw.index(b'"created": "2026') + len(b'"created": "')
    raw[at] = ord("3")  # still a manifest, but not the one checksums.json was written for
    with pytest.raises(BadArchive, match=r"manifest\.json: checksum mismatch"):
        checked(bytes(raw))


def test_nothing_follows_the_checksums(checked: Callable[[bytes], Manifest]) -> None:
    whole = archive()
    end = len(whole) - 1024  # before the two zero blocks that end a tar
    out = io.BytesIO()
    TarWriter(out.write).add(SESSIONS, 1, [b"x"])  # a member (and its padding) more
    with pytest.raises(BadArchive, match=r"sessions\.pairs: after checksums\.json"):
        checked(whole[:end] + out.getvalue() + bytes(1024))


def test_pairs_go_in_parts_of_whole_chunks() -> None:
    chunk = b"x" * (PART_BYTES // 3 + 1)
    assert [len(part) for part in parts([chunk] * 7)] == [3, 3, 1]
    assert list(parts([])) == [[]]  # an empty database is one empty part
    assert pairs_of("messages/shard-001/gen-000002.pairs.000003") == \
        "messages/shard-001/gen-000002.pairs"
    assert pairs_of(SESSIONS) == SESSIONS
    assert pairs_of("messages/shard-001/gen-000002/000005.ldb") is None


def test_a_flipped_byte_names_its_member(checked: Callable[[bytes], Manifest]) -> None:
    raw = bytearray(archive())
    with tarfile.open(fileobj=io.BytesIO(bytes(raw))) as tar:
        offset = tar.getmember("messages/shard-000/gen-000001/000005.ldb").offset_data
    raw[offset + 7] ^= 1
    with pytest.raises(BadArchive, match=r"gen-000001/000005\.ldb: checksum mismatch"):
        checked(bytes(raw))


def test_cut_short_missing_and_extra_members_are_refused(
        checked: Callable[[bytes], Manifest]) -> None:
    raw = archive()
    with pytest.raises(BadArchive, match="cut short"):
        checked(raw[:len(raw) // 2])
    for version in (2, 1):
        data = DATA if version == 2 else DATA_V1
        listed = manifest(version=version)
        retained = next(path for path in data if path.startswith(RETAINED))
        fewer = {k: v for k, v in data.items() if k != retained}
        with pytest.raises(BadArchive, match=r"retained\.pairs.*: listed .* not in the"):
            checked(archive(data=fewer, listed=listed, version=version))
        more = {**data, "messages/shard-000/gen-000003.pairs": b"x"}
        with pytest.raises(BadArchive, match=r"gen-000003\.pairs: not listed"):
            checked(archive(data=more, listed=listed, version=version))
        long = {**data, "x" * 150: b"x"}  # its name in a PAX header before its own
        with pytest.raises(BadArchive, match=r"x{150}: not listed"):
            checked(archive(data=long, listed=listed, version=version))
    whole = archive()
    without = whole[:whole.rindex(CHECKSUMS.encode())]  # cut short before checksums.json
    with pytest.raises(BadArchive, match="cut short"):
        checked(without[:len(without) - len(without) % 512] + bytes(1024))
    with pytest.raises(BadArchive, match="first member"):
        out = io.BytesIO()
        writer = TarWriter(out.write)
        writer.add(SESSIONS, 1, [b"x"])
        writer.close()
        checked(out.getvalue())


def test_a_member_that_changes_size_while_written_is_refused() -> None:
    writer = TarWriter(io.BytesIO().write)
    with pytest.raises(BadArchive, match="changed during the export"):
        writer.add(SESSIONS, 10, [b"12345"])


def test_pairs_round_trip_and_cut_short() -> None:
    # Pairs across the reader's chunks, one larger than a chunk.
    pairs = [(b"k%d" % n, b"v" * n) for n in range(3000)] + [(b"big", b"b" * (CHUNK * 2 + 5))]
    encoded = b"".join(encode_pairs(pairs))
    assert list(decode_pairs(io.BytesIO(encoded), "x")) == pairs
    for cut in (3, 9, len(encoded) - CHUNK, len(encoded) - 1):
        with pytest.raises(BadArchive, match="x: cut short"):
            list(decode_pairs(io.BytesIO(encoded[:cut]), "x"))


class _Pieces:
    """A member whose reads return at most `piece` bytes, as an upload's do (pipe.py)."""

    def __init__(self, data: bytes, piece: int) -> None:
        self._file, self._piece = io.BytesIO(data), piece

    def read(self, size: int = -1) -> bytes:
        return self._file.read(min(size, self._piece))


@pytest.mark.parametrize("piece", [1, 5, 8, 9, 4099, 65536])
def test_pairs_decode_from_short_reads_that_cut_heads_and_pairs_anywhere(piece: int) -> None:
    pairs = [(b"k%d" % n, b"v" * (n * 37 % 5000)) for n in range(400)]
    pairs.append((b"big", b"b" * (CHUNK + 3)))
    encoded = b"".join(encode_pairs(pairs))
    assert list(decode_pairs(_Pieces(encoded, piece), "x")) == pairs
    with pytest.raises(BadArchive, match="x: cut short in a pair's head"):
        list(decode_pairs(_Pieces(encoded[:len(encoded) - len(pairs[-1][1]) - 9], piece), "x"))
    with pytest.raises(BadArchive, match=r"x: cut short in a pair$"):
        list(decode_pairs(_Pieces(encoded[:-1], piece), "x"))


@pytest.mark.parametrize(("change", "error"), [
    (lambda m: m.update(kind="other"), "not a backup manifest"),
    (lambda m: m.update(version=3), "version 3"),
    (lambda m: m.pop("cut"), "missing or malformed"),
    (lambda m: m["files"].append({"path": "../etc/passwd", "size": 1, "sha256": "0" * 64}),
     "not one an archive holds"),
    (lambda m: m["files"].append(dict(m["files"][0])), "listed twice"),
    (lambda m: m["files"].pop(0), "no sessions.pairs"),
    (lambda m: m["generations"].pop(), "one current generation"),
    (lambda m: m["files"].pop(), "gen-000002.pairs not listed"),
])
def test_bad_manifests_are_named(change, error: str) -> None:  # type: ignore[no-untyped-def]
    value = manifest(version=1).to_json()
    change(value)
    with pytest.raises(BadManifest, match=error):
        parse(json.dumps(value).encode())
    with pytest.raises(BadManifest, match="not JSON"):
        parse(b"{")


def test_incremental_leaves_sealed_generations_out() -> None:
    gens = (Generation(0, 1, 10, 20, True, in_archive=False), GENERATIONS[1])
    files = tuple(Member(p, *digest(d)) for p, d in DATA_V1.items() if ".ldb" not in p)
    made = manifest(files, since=15, generations=gens, version=1)
    assert parse(made.encode()).since_us == 15


def test_times_and_formats() -> None:
    assert parse_time("1700000000000000") == 1_700_000_000_000_000
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000_000_000
    with pytest.raises(ValueError, match="offset"):
        parse_time("2023-11-14T22:13:20")
    with pytest.raises(ValueError, match="not microseconds"):
        parse_time("yesterday")
    assert unreadable_formats(manifest(), {"messages": 1}) == []
    assert unreadable_formats(manifest(), {"messages": 0}) == [
        "messages version 1 (this release reads up to 0)"]


def test_a_member_found_twice_is_refused_while_its_first_hash_is_pending(
        checked: Callable[[bytes], Manifest]) -> None:
    """Members are hashed behind the reader (hashing.py): the first copy's verdict may not
    be in when the second copy's header is read."""
    with tarfile.open(fileobj=io.BytesIO(archive())) as source:
        entries = [(info, source.extractfile(info)) for info in source.getmembers()]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as doubled:
        for info, file in [*entries[:2], entries[1], *entries[2:]]:
            assert file is not None
            file.seek(0)
            doubled.addfile(info, file)
    with pytest.raises(BadArchive, match=rf"{entries[1][0].name}: not listed .* found twice"):
        checked(out.getvalue())


@pytest.mark.parametrize("sizes", [[0], [1], [CHUNK * 3 + 5, 0, 7, CHUNK]])
def test_members_hashed_behind_the_reader_have_their_own_digests(sizes: list[int]) -> None:
    members = [bytes([n]) * size for n, size in enumerate(sizes)]
    with Hasher() as hasher:
        digests = []
        for data in members:
            reading, pieces = Hashing(io.BytesIO(data), hasher), []
            while piece := reading.read(CHUNK // 3):
                pieces.append(piece)
            assert b"".join(pieces) == data
            digests.append(reading.digest())
        assert [d.result(10) for d in digests] == [hashlib.sha256(m).hexdigest()
                                                   for m in members]
