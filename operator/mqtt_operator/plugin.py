"""`kubectl mqtt`: a cluster's sites, shards and pending transitions, from its status.

kubectl runs any `kubectl-mqtt` on PATH as `kubectl mqtt`; this reads the MQTTCluster the
operator maintains (no broker access needed), in the layout of `emqx ctl ds info` so EMQX
users read it at a glance.
"""

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from mqtt_operator import constants as c
from mqtt_operator.kube import Kube, client_from_environment, path


class PluginError(Exception):
    pass


def _default_namespace() -> str:
    try:
        _contexts, active = kubernetes.config.list_kube_config_contexts(
            os.environ.get("KUBECONFIG"))
    except (ConfigException, OSError):
        return "default"
    return str((active or {}).get("context", {}).get("namespace") or "default")


def fetch(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    try:
        body = kube.get(path(c.API_VERSION, c.KIND, namespace, name))
        if body is None:
            if not kube.served(c.API_VERSION):
                raise PluginError(f"the MQTTCluster CRD ({c.CRD_NAME}) is not installed"
                                  " in this cluster")
            raise PluginError(f'MQTTCluster "{name}" not found in namespace "{namespace}"')
    except ApiException as error:
        if error.status in (401, 403):
            raise PluginError(
                f"no access to MQTTCluster {namespace}/{name} ({error.status} {error.reason});"
                f" check: kubectl auth can-i get {c.PLURAL} -n {namespace}") from None
        raise PluginError(f"API server error {error.status}: {error.reason}") from None
    except urllib3.exceptions.HTTPError as error:
        raise PluginError(f"cannot reach the API server: {error}") from None
    return dict(body)


def _shard_key(shard: str) -> str:
    return f"{c.DB}/{shard}"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
            .rstrip() for row in rows]


def _shards_lines(placement: Mapping[str, Any]) -> list[str]:
    shards = placement.get("shards") or {}
    rows = [("Shard", "Replicas")] + [(_shard_key(s), " ".join(shards[s]))
                                      for s in sorted(shards, key=int)]
    return ["SHARDS:", *_table(rows)]


def _transitions_lines(transitions: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = [("Shard", "Transitions")] + [
        (_shard_key(str(t["shard"])),
         " ".join([*(f"+{s}" for s in t["add"]), *(f"-{s}" for s in t["remove"])]))
        for t in transitions]
    return ["REPLICA TRANSITIONS:", *(_table(rows) if transitions else ["(none)"])]


def render_sites(body: Mapping[str, Any]) -> str:
    status = body.get("status") or {}
    if not status.get("sites"):
        return "no status yet: is the operator running?\n"
    rows = [(s["id"], s["pod"], s["state"]) for s in status["sites"]]
    lines = ["SITES:", *_table(rows), "", *_shards_lines(status.get("placement") or {}), "",
             *_transitions_lines(status.get("transitions") or [])]
    drain = status.get("drain")
    if drain:
        lines += ["", f"DRAINING: {' '.join(drain['sites'])} ({drain['from']} -> {drain['to']}):"
                      f" {drain['message']}"]
    return "\n".join(lines) + "\n"


def render_shards(body: Mapping[str, Any]) -> str:
    status = body.get("status") or {}
    placement = status.get("placement")
    if not placement:
        return "no status yet: is the operator running?\n"
    loads = placement.get("loads") or {}
    rows = [("Site", "Replicas")] + [(site, str(count)) for site, count in loads.items()]
    lines = [*_shards_lines(placement), "", "REPLICAS PER SITE:", *_table(rows), "",
             *_transitions_lines(status.get("transitions") or [])]
    return "\n".join(lines) + "\n"


def as_json(body: Mapping[str, Any], what: str) -> str:
    status = body.get("status") or {}
    meta = body["metadata"]
    document: dict[str, Any] = {"cluster": meta["name"], "namespace": meta["namespace"],
                                "placement": status.get("placement") or {},
                                "transitions": status.get("transitions") or []}
    if what == "sites":
        document.update(sites=status.get("sites") or [], drain=status.get("drain"))
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kubectl mqtt", description="Inspect MQTTCluster sites and shard placement")
    commands = parser.add_subparsers(dest="command", required=True)
    for command, text in (("sites", "sites with pod and up/down, shards, transitions"),
                          ("shards", "shards with their replica sites, replicas per site")):
        sub = commands.add_parser(command, help=text)
        sub.add_argument("name", help="MQTTCluster name")
        sub.add_argument("-n", "--namespace", help="namespace (default: the context's)")
        sub.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    try:
        kube = Kube(client_from_environment())
        body = fetch(kube, args.namespace or _default_namespace(), args.name)
    except (PluginError, ConfigException) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.output == "json":
        sys.stdout.write(as_json(body, args.command))
    else:
        sys.stdout.write((render_sites if args.command == "sites" else render_shards)(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
