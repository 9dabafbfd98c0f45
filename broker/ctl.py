"""`broker ctl ds ...`: Durable Storage administration, like `emqx ctl ds`.

A running node is asked over its HTTP API (`--url`); a stopped one is read from its data dir
(`--data-dir`), which LevelDB's lock refuses while a node has it open.
"""

import argparse
import asyncio
import json
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import plyvel

from broker.ds import DurableStorage, Settings

DEFAULT_URL = "http://127.0.0.1:18083"


def _http(url: str, method: str = "GET") -> dict[str, Any]:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


async def _offline_info(data_dir: Path) -> dict[str, Any]:
    if not (data_dir / "ds").is_dir():
        raise FileNotFoundError(f"no durable storage in {data_dir}")
    storage = DurableStorage(data_dir, Settings())
    try:
        return storage.info()
    finally:
        await storage.close()


def _time(us: int | None) -> str:
    if not us:
        return "-"
    return datetime.fromtimestamp(us / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def format_info(info: dict[str, Any]) -> str:
    lines = ["SITE", f"  {info['site_id']} (this node)"]
    for db in info["databases"]:
        lines.append("")
        if "shards" not in db:
            lines.append(f"DB {db['name']}: {db['n_shards']} shard, {db['keys']} keys,"
                         f" {db['commits']} transactions since start")
            continue
        lines.append(f"DB {db['name']}: {db['n_shards']} shards, replication factor"
                     f" {db['replication_factor']}")
        lines.append(f"  {'SHARD':<6}{'GEN':<5}{'STATE':<9}{'SINCE':<25}{'UNTIL':<25}"
                     f"{'MESSAGES':>10}{'BYTES':>13}{'STREAMS':>9}")
        for shard in db["shards"]:
            for gen in shard["generations"]:
                lines.append(
                    f"  {shard['shard']:<6}{gen['generation']:<5}{gen['state']:<9}"
                    f"{_time(gen['since']):<25}{_time(gen['until']):<25}"
                    f"{gen['messages']:>10}{gen['bytes']:>13}{gen['streams']:>9}"
                )
    return "\n".join(lines)


def ds_command(args: argparse.Namespace) -> int:
    try:
        if args.action == "seal":
            info = _http(args.url.rstrip("/") + "/api/v5/ds/storages/messages/generations",
                         method="POST")
            print(json.dumps(info, indent=1) if args.output == "json"
                  else f"sealed {info['sealed']} generation(s)")
            return 0
        if args.data_dir:
            info = asyncio.run(_offline_info(Path(args.data_dir)))
        else:
            info = _http(args.url.rstrip("/") + "/api/v5/ds/storages")
    except (urllib.error.URLError, OSError, plyvel.Error) as error:
        where = args.data_dir or args.url
        print(f"broker ctl: cannot read durable storage at {where}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=1) if args.output == "json" else format_info(info))
    return 0


def add_parser(commands: Any) -> None:
    ctl = commands.add_parser("ctl", help="administer a node (like `emqx ctl`)")
    topics = ctl.add_subparsers(dest="topic", required=True)
    ds = topics.add_parser("ds", help="Durable Storage: info, seal")
    ds.add_argument("action", choices=["info", "seal"])
    ds.add_argument("--url", default=DEFAULT_URL, help="HTTP API of a running node")
    ds.add_argument("--data-dir", help="read a stopped node's data dir instead (info only)")
    ds.add_argument("-o", "--output", choices=["text", "json"], default="text")
    ds.set_defaults(func=ds_command)
