"""`broker ctl data export|import|verify`: backups of a node's or cluster's durable state
(broker/backup/, /work/helpers/BACKUP_CONTRACT.md).

`export` and `import` ask a running node over its HTTP API, streaming the archive both ways
(never holding it in memory); `import --force --data-dir DIR` writes a stopped node's data
dir instead; `verify` reads an archive alone. An export is written to FILE.part, verified
whole and only then renamed FILE: a FILE that exists is a complete archive.
"""

import argparse
import gzip
import http.client
import io
import json
import secrets
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from broker.backup.archive import CHUNK, BadArchive, verify
from broker.backup.direct import DirectFile
from broker.backup.manifest import NAME, Manifest, parse_time
from broker.backup.stream_check import StreamCheck

_TIMEOUT: Final = 600.0  # seconds without a byte: an export's first pass sends nothing


def _request(args: argparse.Namespace, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        args.url.rstrip("/") + path, data=body, method="POST",
        headers={**args.auth_headers(args), **(headers or {})})
    return urllib.request.urlopen(request, timeout=_TIMEOUT)


def _refusal(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read())
        return f"{error.code} {body.get('code')}: {body.get('message')}"
    except (ValueError, AttributeError):
        return f"{error.code} {error.reason}"


def _summary(manifest: Manifest) -> dict[str, Any]:
    return {"created": manifest.created, "release": manifest.release,
            "incremental_since_us": manifest.since_us, "cut": manifest.cut,
            "members": len(manifest.files) + (1 if manifest.version == 1 else 2),
            "bytes": sum(m.size for m in manifest.files),
            "generations": sum(g.in_archive for g in manifest.generations),
            "shards": manifest.n_shards, "backend": manifest.cluster.get("backend")}


def _receive(response: Any, check: StreamCheck, out: Any) -> None:
    """The archive checked, and written to `out` (a compressing file) as it comes."""
    buffer = memoryview(bytearray(CHUNK))
    while read := response.readinto(buffer):
        check.feed(buffer[:read])
        out.write(buffer[:read])
        check.settle()


def _receive_into(response: Any, check: StreamCheck, file: DirectFile) -> None:
    """The archive read straight into the file's buffer, a CHUNK at most at a time, checked
    there, written from it. The hasher may lag until the buffer, written whole, is filled
    again."""
    space = file.space()[:CHUNK]
    while read := response.readinto(space):
        check.feed(space[:read])
        wraps = read == len(file.space())
        file.commit(read)
        if wraps:
            check.settle()
        space = file.space()[:CHUNK]


def export_command(args: argparse.Namespace) -> int:
    target = Path(args.file)
    part = target.with_name(target.name + ".part")
    query = f"?since={urllib.parse.quote(str(parse_time(args.since)))}" if args.since else ""
    started = time.monotonic()
    try:
        with _request(args, "/api/v5/data/export" + query) as response, \
                DirectFile(part) as file:
            sha = response.headers.get("X-Backup-Manifest-Sha256", "")
            # Checked as it arrives (the node may fail half way: only a whole archive is
            # kept), hashed on a thread of its own while the next piece is read.
            with ThreadPoolExecutor(1, thread_name_prefix="hash") as hasher:
                check = StreamCheck(hasher)
                if target.name.endswith(".gz"):  # the node sends a plain tar: compressed here
                    with gzip.GzipFile(fileobj=file, mode="wb") as out:
                        _receive(response, check, out)
                else:
                    _receive_into(response, check, file)
                check.finish()
            file.close()
    except urllib.error.HTTPError as error:
        part.unlink(missing_ok=True)
        print(f"broker ctl data export: {_refusal(error)}", file=sys.stderr)
        return 1
    except (OSError, http.client.HTTPException, BadArchive) as error:  # IncompleteRead
        part.unlink(missing_ok=True)
        print(f"broker ctl data export: {error}", file=sys.stderr)
        return 1
    part.replace(target)
    result = {"file": str(target), "bytes": target.stat().st_size,
              "seconds": round(time.monotonic() - started, 3), "manifest_sha256": sha}
    print(json.dumps(result) if args.output == "json" else
          f"{target}: {result['bytes']} bytes in {result['seconds']} s")
    return 0


def _import_offline(args: argparse.Namespace, paths: list[Path]) -> dict[str, int] | None:
    """`import --force --data-dir`: the counts restored, or None (the refusal printed)."""
    # Here, not at the top: Durable Storage's modules, which an export and an import over
    # HTTP do not need, cost a fifth of a second to import (half the CLI's start;
    # tests/unit/test_startup_imports.py), before an online import's first byte goes out.
    from broker.backup.restore import ImportRefused, import_offline
    from broker.format_check import FormatRefused, inspect, wal_dir_of

    data_dir = Path(args.data_dir)
    wal_dir = Path(args.wal_dir) if args.wal_dir else wal_dir_of(data_dir)
    try:
        inspect(data_dir, wal_dir)  # a dir a newer release wrote is left alone
        return import_offline(paths, data_dir, wal_dir)
    except (ImportRefused, FormatRefused, OSError) as error:
        print(f"broker ctl data import: {error}", file=sys.stderr)
        return None


def import_command(args: argparse.Namespace) -> int:
    paths = [Path(file) for file in args.files]
    if args.data_dir or args.force:
        if not (args.data_dir and args.force):
            print("broker ctl data import: --data-dir replaces a stopped node's durable"
                  " state: give --force with it (and --force only with --data-dir)",
                  file=sys.stderr)
            return 2
        offline = _import_offline(args, paths)
        if offline is None:
            return 1
        counts = offline
    else:
        try:
            counts = _upload(args, paths)
        except urllib.error.HTTPError as error:
            print(f"broker ctl data import: {_refusal(error)}", file=sys.stderr)
            return 1
        except OSError as error:
            print(f"broker ctl data import: {error}", file=sys.stderr)
            return 1
    files = " ".join(map(str, paths))
    print(json.dumps({"file": str(paths[0]), "increments": [str(path) for path in paths[1:]],
                      "restored": counts})
          if args.output == "json"
          else f"{files}: restored " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def _multipart(paths: list[Path]) -> tuple[str, list[bytes | Path]]:
    """(content type, body) of `multipart/mixed` holding the archives, a part each (with its
    length: the node reads it without searching for the boundary)."""
    boundary = secrets.token_hex(24)
    body: list[bytes | Path] = []
    for path in paths:
        body += [(f"--{boundary}\r\nContent-Type: application/x-tar\r\nContent-Length:"
                  f" {path.stat().st_size}\r\nContent-Disposition: attachment; filename="
                  f"\"{urllib.parse.quote(path.name)}\"\r\n\r\n").encode(), path, b"\r\n"]
    return f"multipart/mixed; boundary={boundary}", [*body, f"--{boundary}--\r\n".encode()]


def _upload(args: argparse.Namespace, paths: list[Path]) -> dict[str, int]:
    """POSTs the archive (several: `_multipart`), each file sent by the kernel from the page
    cache (socket.sendfile: no copy through this process; over TLS, read and sent)."""
    where = urllib.parse.urlsplit(args.url)
    make = http.client.HTTPSConnection if where.scheme == "https" else http.client.HTTPConnection
    connection = make(where.hostname or "127.0.0.1", where.port, timeout=_TIMEOUT)
    kind, body = (("application/x-tar", [paths[0]]) if len(paths) == 1 else
                  _multipart(paths))
    length = sum(len(piece) if isinstance(piece, bytes) else piece.stat().st_size
                 for piece in body)
    try:
        connection.putrequest("POST", where.path.rstrip("/") + "/api/v5/data/import")
        for name, value in {**args.auth_headers(args), "Content-Type": kind,
                            "Content-Length": str(length)}.items():
            connection.putheader(name, value)
        connection.endheaders()
        for piece in body:
            if isinstance(piece, bytes):
                connection.send(piece)
                continue
            assert connection.sock is not None  # (connected by endheaders)
            with piece.open("rb") as file:
                connection.sock.sendfile(file)
        response = connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise urllib.error.HTTPError(args.url, response.status, response.reason,
                                         response.headers, io.BytesIO(answer))
        return json.loads(answer)["restored"]  # type: ignore[no-any-return]
    finally:
        connection.close()


def verify_command(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        with path.open("rb") as file:
            manifest = verify(file)
    except (OSError, BadArchive) as error:
        print(f"broker ctl data verify: {path}: {error}", file=sys.stderr)
        return 1
    summary = _summary(manifest)
    print(json.dumps(summary) if args.output == "json" else
          f"{path}: OK, {summary['members']} members ({NAME}, its checksums and"
          f" {summary['bytes']} bytes of data), made {manifest.created} by {manifest.release}")
    return 0


def add_data_parser(topics: Any, add_api_options: Callable[[argparse.ArgumentParser], None],
                    auth_headers: Callable[[argparse.Namespace], dict[str, str]]) -> None:
    """`auth_headers`: ctl's, for the API key options (ctl imports this module)."""
    data = topics.add_parser("data", help="backups: export, import, verify an archive")
    verbs = data.add_subparsers(dest="action", required=True)
    export = verbs.add_parser("export", help="an archive of the durable state, at one cut")
    export.add_argument("file", help="where to write it (.tar, or .tar.gz to compress)")
    export.add_argument("--since", metavar="TIME", help="incremental: only the sealed"
                        " generations made after TIME (µs or RFC 3339), plus current state")
    imp = verbs.add_parser("import", help="restore an archive into an empty node or cluster")
    imp.add_argument("files", nargs="+", metavar="FILE",
                     help="an archive; or a full archive and its incremental ones (--since),"
                     " oldest first: each must follow the one before it")
    imp.add_argument("--force", action="store_true",
                     help="with --data-dir: replace a stopped node's durable state")
    imp.add_argument("--data-dir", help="a stopped node's data dir (offline)")
    imp.add_argument("--wal-dir", help="its durable_storage.raft.wal_dir, if set")
    check = verbs.add_parser("verify", help="check an archive's checksums without importing")
    check.add_argument("file")
    for parser, command in ((export, export_command), (imp, import_command),
                            (check, verify_command)):
        add_api_options(parser)
        parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
        parser.set_defaults(func=command, auth_headers=auth_headers)
