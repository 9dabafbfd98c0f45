"""`broker ctl data export|verify`: an archive of a node's or cluster's durable state
streamed from its HTTP API and checked as it arrives (never held in memory), or an archive
checked alone. An export is written to FILE.part, verified whole and only then renamed
FILE: a FILE that exists is a complete archive.
"""

import argparse
import gzip
import http.client
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from broker.backup.archive import CHUNK, BadArchive, verify
from broker.backup.manifest import NAME, Manifest, parse_time
from broker.backup.stream_check import StreamCheck
from broker.ctl_import import TIMEOUT, refusal
from broker.direct import DirectFile


def _request(args: argparse.Namespace, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        args.url.rstrip("/") + path, data=body, method="POST",
        headers={**args.auth_headers(args), **(headers or {})})
    return urllib.request.urlopen(request, timeout=TIMEOUT)


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
        print(f"broker ctl data export: {refusal(error.code, error.reason, error.read())}",
              file=sys.stderr)
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
