"""`broker ctl data import`: an archive (or a full one and its increments) restored into a
running node over its HTTP API, or into a stopped node's data dir (`--force --data-dir`).

Only what an upload needs is imported here (http.client, not urllib.request; nothing of
the archive's readers: the node checks the archive): the CLI's start is part of every
import's time.
"""

import argparse
import http.client
import json
import sys
import urllib.parse
from pathlib import Path
from typing import Final

TIMEOUT: Final = 600.0  # seconds without a byte (an export's first pass sends nothing)


class Refused(Exception):
    """The node answered with an error: `refusal` says it."""


def refusal(status: int, reason: str, body: bytes) -> str:
    """A node's error answer as the operator reads it (its JSON `code` and `message`)."""
    try:
        answer = json.loads(body)
        return f"{status} {answer.get('code')}: {answer.get('message')}"
    except (ValueError, AttributeError):
        return f"{status} {reason}"


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
        except (Refused, http.client.HTTPException, OSError) as error:
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
    import secrets  # (here: only several archives need it)

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
    connection = make(where.hostname or "127.0.0.1", where.port, timeout=TIMEOUT)
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
            raise Refused(refusal(response.status, response.reason, answer))
        return json.loads(answer)["restored"]  # type: ignore[no-any-return]
    finally:
        connection.close()
