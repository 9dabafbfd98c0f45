"""`broker ctl data export|import|verify`: backups of a node's or cluster's durable state
(broker/backup/, /work/helpers/BACKUP_CONTRACT.md).

`export` and `import` ask a running node over its HTTP API, streaming the archive both ways
(never holding it in memory); `import --force --data-dir DIR` writes a stopped node's data
dir instead; `verify` reads an archive alone. Each verb's module is imported when it runs:
the CLI's start is part of every export's and import's time (an import needs none of the
archive's readers, an export none of the upload's client).
"""

import argparse
from collections.abc import Callable
from typing import Any


def _export(args: argparse.Namespace) -> int:
    from broker.ctl_export import export_command

    return export_command(args)


def _import(args: argparse.Namespace) -> int:
    from broker.ctl_import import import_command

    return import_command(args)


def _verify(args: argparse.Namespace) -> int:
    from broker.ctl_export import verify_command

    return verify_command(args)


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
    for parser, command in ((export, _export), (imp, _import), (check, _verify)):
        add_api_options(parser)
        parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
        parser.set_defaults(func=command, auth_headers=auth_headers)
