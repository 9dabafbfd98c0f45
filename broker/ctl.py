"""`broker ctl cluster|ds|sessions ...`: administration, like `emqx ctl`.

A running node is asked over its HTTP API (`--url`) with an API key (`--api-key KEY:SECRET`,
`--api-key-file` naming a bootstrap file, whose first key is used, or $BROKER_API_KEY, which
keeps the secret out of the process list); for `ds info` a stopped one can be read from its
data dir (`--data-dir`), which LevelDB's lock refuses while a node has it open.
"""

import argparse
import base64
import functools
import json
import os
import sys
import urllib.error
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from broker.auth.users_ctl import add_users_parser
from broker.ctl_data import add_data_parser

DEFAULT_URL = "http://127.0.0.1:18083"
API_KEY_ENV = "BROKER_API_KEY"


class Refused(Exception):
    """The node turned the key down (401, 403): the same fix whatever the command."""


def _api_key(args: argparse.Namespace) -> str | None:
    """KEY:SECRET from the first of --api-key, --api-key-file, $BROKER_API_KEY given."""
    if args.api_key:
        return str(args.api_key)
    if args.api_key_file:
        # Here, not at the top: broker.http.auth brings aiohttp's server, a tenth of a second
        # of every ctl command's start (a backup's export and import time it).
        from broker.http.auth import ApiKeyFileError, parse_api_keys
        path = args.api_key_file
        try:
            name, key = next(iter(parse_api_keys(Path(path).read_text(), path).items()))
        except (OSError, UnicodeDecodeError, ApiKeyFileError) as error:
            raise Refused(f"--api-key-file: {error}") from None
        return f"{name}:{key.secret.decode()}"
    return os.environ.get(API_KEY_ENV) or None


def auth_headers(args: argparse.Namespace) -> dict[str, str]:
    key = _api_key(args)
    return {"Authorization": "Basic " + base64.b64encode(key.encode()).decode()} if key else {}


def _http(args: argparse.Namespace, path: str, method: str = "GET",
          body: dict[str, Any] | None = None) -> Any:
    import urllib.request  # (here: `ctl data` does not need it, and it is not free)

    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", **auth_headers(args)}
    key = _api_key(args)
    request = urllib.request.Request(args.url.rstrip("/") + path, data=data, method=method,
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        if error.code == 401:
            raise Refused(f"{args.url}: 401: " + (
                "the API key was refused" if key else
                f"an API key is needed: --api-key KEY:SECRET, --api-key-file FILE or"
                f" ${API_KEY_ENV} (a node without api_key.bootstrap_file keeps its own in"
                f" <node.data_dir>/api_key)")) from None
        if error.code == 403:
            raise Refused(f"{args.url}: 403: this key may only read; {method} {path} needs an"
                          f" administrator key") from None
        raise


def _calls_api_headers(args: argparse.Namespace) -> dict[str, str]:
    """`auth_headers` for `ctl data`: a bad --api-key-file is a message, not a traceback."""
    try:
        return auth_headers(args)
    except Refused as refused:
        raise OSError(str(refused)) from None


def _calls_api(command: Callable[[argparse.Namespace], int]
               ) -> Callable[[argparse.Namespace], int]:
    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except Refused as refused:
            print(f"broker ctl: {refused}", file=sys.stderr)
            return 1

    return run


async def _offline_info(data_dir: Path) -> dict[str, Any]:
    from broker.ds import DurableStorage, Settings
    from broker.format_check import inspect, wal_dir_of

    if not (data_dir / "ds").is_dir():
        raise FileNotFoundError(f"no durable storage in {data_dir}")
    inspect(data_dir, wal_dir_of(data_dir))  # opening what a newer release wrote could harm it
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
    if info.get("sites"):  # builtin_raft: the shards each site votes in
        lines += ["", f"  {'SITE':<18}{'NODE':<28}{'UP':<5}SHARDS (messages; * leaving)"]
        for site in info["sites"]:
            held = [shard["id"] + ("*" if shard.get("transition") == "leaving" else "")
                    for shard in site["shards"] if shard["storage"] == "messages"]
            lines.append(f"  {site['site']:<18}{site['node']:<28}"
                         f"{'yes' if site['up'] else 'no':<5}{' '.join(held) or '-'}")
    for db in info["databases"]:
        lines.append("")
        if "shards" not in db:
            lines.append(f"DB {db['name']}: {db['n_shards']} shard, about {db['bytes']} bytes"
                         f" on disk, {db['commits']} transactions since start")
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


def _sites(args: argparse.Namespace) -> list[dict[str, Any]]:
    """builtin_raft's sites and the shards they hold; none from a node with node-local
    storage (404)."""
    try:
        sites = _http(args, "/api/v5/ds/sites")
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return []
        raise
    return [_http(args, f"/api/v5/ds/sites/{site}") for site in sites]


_REPLICA_ACTIONS = ("join", "leave", "set-replicas", "forget")
_DB_ONLY = ("broker ctl: only the `messages` database has replicas to place (`sessions` is"
            " held by every member)")


def _replica_request(action: str, operands: list[str]) -> tuple[str, str, Any] | str:
    """(method, path, body) for a replica verb, or what is wrong with its operands."""
    if action == "forget":
        if len(operands) != 1:
            return "broker ctl: ds forget SITE"
        return "DELETE", f"/api/v5/ds/sites/{urllib.parse.quote(operands[0])}", None
    if len(operands) < 2 or (action != "set-replicas" and len(operands) != 2):
        return f"broker ctl: ds {action} DB SITE" + ("..." if action == "set-replicas" else "")
    db, sites = operands[0], operands[1:]
    if db != "messages":
        return _DB_ONLY
    path = "/api/v5/ds/storages/messages/replicas"
    if action == "set-replicas":
        return "PUT", path, sites
    return ("PUT" if action == "join" else "DELETE"), f"{path}/{urllib.parse.quote(sites[0])}", None


def ds_replica_command(args: argparse.Namespace) -> int:
    request = _replica_request(args.action, args.operands)
    if isinstance(request, str):
        print(request, file=sys.stderr)
        return 2
    method, path, body = request
    try:
        answer = _http(args, path, method=method, body=body)
    except urllib.error.HTTPError as error:
        try:
            message = json.loads(error.read()).get("message", error.reason)
        except ValueError:
            message = error.reason
        if error.code == 404 and args.action != "forget":
            message = "this node does not replicate its Durable Storage (builtin_local)"
        print(f"broker ctl: ds {args.action}: {message}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as error:
        print(f"broker ctl: cannot reach {args.url}: {error}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(answer, indent=1))
    elif args.action == "forget":
        print(f"forgot site {answer['forgotten']}")
    else:
        print("sites holding messages' votes: " + " ".join(answer))
    return 0


def ds_command(args: argparse.Namespace) -> int:
    # Here and in _offline_info, not at the top: Durable Storage's modules cost a fifth of a
    # second to import, which every other `broker ctl` command (an export) would wait for.
    import asyncio

    import plyvel  # type: ignore[import-untyped]

    from broker.format_check import FormatRefused

    if args.action in _REPLICA_ACTIONS:
        return ds_replica_command(args)
    try:
        if args.action == "seal":
            info = _http(args, "/api/v5/ds/storages/messages/generations", method="POST")
            print(json.dumps(info, indent=1) if args.output == "json"
                  else f"sealed {info['sealed']} generation(s)")
            return 0
        if args.data_dir:
            info = asyncio.run(_offline_info(Path(args.data_dir)))
        else:
            info = _http(args, "/api/v5/ds/storages")
            info["sites"] = _sites(args)
    except (urllib.error.URLError, OSError, plyvel.Error, FormatRefused) as error:
        where = args.data_dir or args.url
        print(f"broker ctl: cannot read durable storage at {where}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=1) if args.output == "json" else format_info(info))
    return 0


def format_sessions(clients: list[dict[str, Any]]) -> str:
    lines = [f"{'CLIENT ID':<32}{'STATE':<14}{'KIND':<8}{'EXPIRY':>8}{'SUBS':>6}{'INFLIGHT':>10}"]
    for client in clients:
        lines.append(
            f"{client['clientid']:<32}"
            f"{'connected' if client['connected'] else 'disconnected':<14}"
            f"{'durable' if client.get('durable') else 'memory':<8}"
            f"{client['expiry_interval']:>8}{client['subscriptions_cnt']:>6}"
            f"{client['inflight_cnt']:>10}"
        )
    return "\n".join(lines)


def format_session(client: dict[str, Any], subscriptions: list[dict[str, Any]]) -> str:
    lines = [f"{key}: {value}" for key, value in client.items()]
    lines.append("subscriptions:")
    lines.extend(f"  {s['topic']} qos={s['qos']} nl={s['nl']} rap={s['rap']} rh={s['rh']}"
                 f" subid={s['subid']}" for s in subscriptions)
    return "\n".join(lines)


def sessions_command(args: argparse.Namespace) -> int:
    try:
        if args.action == "list":
            clients = _http(args, "/api/v5/clients?limit=10000")["data"]
            print(json.dumps(clients, indent=1) if args.output == "json"
                  else format_sessions(clients))
            return 0
        if not args.client_id:
            print("broker ctl: sessions show needs a client ID", file=sys.stderr)
            return 2
        quoted = urllib.parse.quote(args.client_id, safe="")
        client = _http(args, f"/api/v5/clients/{quoted}")
        subscriptions = _http(args, f"/api/v5/subscriptions?limit=10000&clientid={quoted}")[
            "data"]
    except urllib.error.HTTPError as error:
        if error.code == 404:
            print(f"broker ctl: no session {args.client_id!r}", file=sys.stderr)
            return 1
        print(f"broker ctl: {args.url}: {error}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as error:
        print(f"broker ctl: cannot reach {args.url}: {error}", file=sys.stderr)
        return 1
    print(json.dumps({**client, "subscriptions": subscriptions}, indent=1)
          if args.output == "json" else format_session(client, subscriptions))
    return 0


def format_cluster(status: dict[str, Any]) -> str:
    lines = [f"Cluster {status['name']}, cluster version {status.get('cluster_version', '?')}",
             f"{'NODE':<40}{'SITE':<18}{'STATUS':<10}{'RELEASE':<10}ADDRESS"]
    lines += [f"{n['node'] + (' (this node)' if n['self'] else ''):<40}{n['site']:<18}"
              f"{n['node_status']:<10}{n.get('release') or '-':<10}{n['address']}"
              for n in status["nodes"]]
    return "\n".join(lines)


def cluster_command(args: argparse.Namespace) -> int:
    base = "/api/v5/cluster"
    if args.action in ("join", "force-leave") and not args.node:
        print(f"broker ctl: cluster {args.action} needs a node name", file=sys.stderr)
        return 2
    try:
        if args.action == "join":
            _http(args, base + "/join", "POST", {"node": args.node})
        elif args.action == "leave":
            _http(args, base + "/leave", "POST", {})
        elif args.action == "force-leave":
            _http(args, f"{base}/{urllib.parse.quote(args.node, safe='')}/force_leave",
                  "DELETE")
        status = _http(args, base)
    except urllib.error.HTTPError as error:
        print(f"broker ctl: {args.action}: {error.read().decode(errors='replace')}",
              file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as error:
        print(f"broker ctl: cannot reach {args.url}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=1) if args.output == "json" else format_cluster(status))
    return 0


def format_raft(status: dict[str, Any]) -> str:
    lines = [f"Node {status['node']} (site {status['site']}), metadata group:"
             f" {status['bootstrap']}"]
    for group in status["groups"]:
        names = group["nodes"]
        leader = group["leader"]
        lines += [
            f"GROUP {group['id']} ({group['name']}, epoch {group['epoch']})",
            f"  role {group['role']}, leader {names.get(leader, leader) if leader else '-'},"
            f" term {group['term']}",
            f"  commit {group['commit']}, applied {group['applied']}, log entries"
            f" {group['log_entries']} after snapshot {group['snapshot_index']}",
            "  voters   " + (", ".join(names[site] for site in group["voters"]) or "-"),
            "  learners " + (", ".join(names[site] for site in group["learners"]) or "-"),
        ]
    return "\n".join(lines)


def raft_command(args: argparse.Namespace) -> int:
    try:
        status = _http(args, "/api/v5/raft")
    except (urllib.error.URLError, OSError) as error:
        print(f"broker ctl: cannot reach {args.url}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=1) if args.output == "json" else format_raft(status))
    return 0


def _add_api_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL, help="HTTP API of a running node")
    parser.add_argument("--api-key", metavar="KEY:SECRET",
                        help=f"API key (visible in the process list: prefer ${API_KEY_ENV})")
    parser.add_argument("--api-key-file", metavar="FILE",
                        help="a bootstrap file (KEY:SECRET[:ROLE] lines): its first key")


def add_parser(commands: Any) -> None:
    ctl = commands.add_parser("ctl", help="administer a node (like `emqx ctl`)")
    topics = ctl.add_subparsers(dest="topic", required=True)
    cluster = topics.add_parser("cluster", help="members: status, join, leave, force-leave")
    cluster.add_argument("action", choices=["status", "join", "leave", "force-leave"])
    cluster.add_argument("node", nargs="?", help="NAME@HOST[:PORT] to join, or the node"
                         " (name or site) to force out")
    _add_api_options(cluster)
    cluster.add_argument("-o", "--output", choices=["text", "json"], default="text")
    cluster.set_defaults(func=_calls_api(cluster_command))
    ds = topics.add_parser("ds", help="Durable Storage: info, seal, join, leave,"
                           " set-replicas, forget")
    ds.add_argument("action", choices=["info", "seal", *_REPLICA_ACTIONS])
    ds.add_argument("operands", nargs="*", metavar="DB|SITE",
                    help="join|leave DB SITE, set-replicas DB SITE..., forget SITE")
    _add_api_options(ds)
    ds.add_argument("--data-dir", help="read a stopped node's data dir instead (info only)")
    ds.add_argument("-o", "--output", choices=["text", "json"], default="text")
    ds.set_defaults(func=_calls_api(ds_command))
    raft = topics.add_parser("raft", help="Raft groups of a node: status")
    raft.add_argument("action", choices=["status"])
    _add_api_options(raft)
    raft.add_argument("-o", "--output", choices=["text", "json"], default="text")
    raft.set_defaults(func=_calls_api(raft_command))
    add_users_parser(topics)
    add_data_parser(topics, _add_api_options, _calls_api_headers)
    sessions = topics.add_parser("sessions", help="sessions, durable ones included: list, show")
    sessions.add_argument("action", choices=["list", "show"])
    sessions.add_argument("client_id", nargs="?", help="for show")
    _add_api_options(sessions)
    sessions.add_argument("-o", "--output", choices=["text", "json"], default="text")
    sessions.set_defaults(func=_calls_api(sessions_command))
