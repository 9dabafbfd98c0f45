"""`kubectl mqtt`: a cluster's sites, shards and pending transitions, from its status, and
its members as the brokers see them.

kubectl runs any `kubectl-mqtt` on PATH as `kubectl mqtt`; `sites` and `shards` read the
MQTTCluster the operator maintains (no broker access needed), in the layout of `emqx ctl ds
info` so EMQX users read it at a glance. `nodes` asks one broker (`GET /api/v5/nodes`)
through the API server's pod proxy: it works from wherever kubectl does, pod network or
not, with no port-forward. The brokers want an API key: the viewer key of the cluster's
Secret `<name>-api-key`, so the user needs `get` on that Secret and on `pods/proxy`. It
travels as `X-Api-Key`, because the API server removes `Authorization` from what it proxies.
"""

import argparse
import base64
import binascii
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


_NODE_KEYS = frozenset({"node", "site", "node_status"})  # what every /api/v5/nodes entry has
KEY_HEADER = "X-Api-Key"  # the brokers' other way to take a key (broker/http/auth.py)


def _default_namespace() -> str:
    try:
        _contexts, active = kubernetes.config.list_kube_config_contexts(
            os.environ.get("KUBECONFIG"))
    except (ConfigException, OSError):
        return "default"
    return str((active or {}).get("context", {}).get("namespace") or "default")


def _why(error: ApiException) -> str:
    """The API server's own message (e.g. why it cannot proxy to a pod), else the reason."""
    try:
        return str(json.loads(error.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(error.reason)


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
        raise PluginError(f"API server error {error.status}: {_why(error)}") from None
    except urllib3.exceptions.HTTPError as error:
        raise PluginError(f"cannot reach the API server: {error}") from None
    return dict(body)


def api_key(kube: Kube, namespace: str, cluster: str) -> str | None:
    """KEY:SECRET of the cluster's viewer key; None when there is no Secret (a cluster of
    contract v2, whose brokers ask for no key)."""
    name = c.api_key_secret_name(cluster)
    try:
        secret = kube.get(path("v1", "Secret", namespace, name))
    except ApiException as error:
        if error.status in (401, 403):
            raise PluginError(
                f"no access to Secret {namespace}/{name}, the brokers' API key ({error.status}"
                f" {error.reason}); check: kubectl auth can-i get secret/{name} -n {namespace}"
            ) from None
        raise PluginError(f"API server error {error.status}: {_why(error)}") from None
    if secret is None:
        return None
    data = secret.get("data") or {}
    try:
        return ":".join(base64.b64decode(data[key], validate=True).decode()
                        for key in (c.API_KEY_USERNAME, c.API_KEY_PASSWORD))
    except (KeyError, binascii.Error, UnicodeDecodeError):
        raise PluginError(f"Secret {namespace}/{name} has no {c.API_KEY_USERNAME} and"
                          f" {c.API_KEY_PASSWORD}: no key to ask the brokers with") from None


def _from_api_server(error: ApiException) -> bool:
    """Whether the API server itself refused (its answers are Status objects), rather than
    the broker behind the proxy (whose answers are EMQX's `{"code", "message"}`)."""
    try:
        return bool(json.loads(error.body or "").get("kind") == "Status")
    except (ValueError, AttributeError):
        return True


def ask_nodes(kube: Kube, body: Mapping[str, Any], key: str | None
              ) -> tuple[str, list[dict[str, Any]]]:
    """(the pod that answered, its `GET /api/v5/nodes`): Ready pods first, then the others,
    since a broker that has not joined yet still answers, and a cluster whose pods never
    become Ready is when the members' view is wanted most."""
    namespace, port = body["metadata"]["namespace"], body["spec"]["listeners"]["httpPort"]
    members = (body.get("status") or {}).get("sites") or []
    if not members:
        raise PluginError("no status yet: is the operator running?")
    failures = []
    for site in sorted(members, key=lambda site: site["state"] != "up"):  # stable: by ordinal
        pod = site["pod"]
        url = f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{c.NODES_PATH}"
        try:
            answer = kube.request("GET", url, headers={KEY_HEADER: key} if key else None)
        except ApiException as error:
            if error.status in (401, 403) and _from_api_server(error):
                raise PluginError(
                    f"no access to pod {namespace}/{pod} through the API server's proxy"
                    f" ({error.status} {error.reason}); check: kubectl auth can-i get"
                    f" pods --subresource=proxy -n {namespace}") from None
            failures.append(f"{pod}: {error.status} {_why(error)}")
            continue
        except ValueError as error:  # not JSON
            failures.append(f"{pod}: unreadable answer: {error}")
            continue
        except urllib3.exceptions.HTTPError as error:
            raise PluginError(f"cannot reach the API server: {error}") from None
        if isinstance(answer, list) and all(isinstance(node, dict) and node.keys() >= _NODE_KEYS
                                            for node in answer):
            return pod, answer
        failures.append(f"{pod}: unreadable answer: not a list of nodes")
    raise PluginError(f"no broker answered GET {c.NODES_PATH}: " + "; ".join(failures))


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


def _uptime(milliseconds: int | None) -> str:
    """The two largest units, like kubectl's AGE column: "1d2h", "5m3s"."""
    if milliseconds is None:
        return "-"
    minutes, seconds = divmod(milliseconds // 1000, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    first = next((i for i, (value, _) in enumerate(parts) if value), len(parts) - 1)
    return "".join(f"{value}{unit}" for value, unit in parts[first:first + 2])


def render_nodes(pod: str, nodes: Sequence[Mapping[str, Any]]) -> str:
    """`emqx ctl cluster status` as a table; a member that does not answer its peer is
    listed `stopped` by the broker, with nothing known about it ("-")."""
    rows = [("NODE", "SITE", "STATUS", "CONNECTIONS", "UPTIME", "VERSION")] + [
        (node["node"], node["site"], node["node_status"],
         "-" if node.get("connections") is None else str(node["connections"]),
         _uptime(node.get("uptime")), node.get("version") or "-") for node in nodes]
    return "\n".join([f"NODES (as {pod} sees them):", *_table(rows)]) + "\n"


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
                          ("shards", "shards with their replica sites, replicas per site"),
                          ("nodes", "cluster members as a broker sees them (pod proxy)")):
        sub = commands.add_parser(command, help=text)
        sub.add_argument("name", help="MQTTCluster name")
        sub.add_argument("-n", "--namespace", help="namespace (default: the context's)")
        sub.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    try:
        kube = Kube(client_from_environment())
        body = fetch(kube, args.namespace or _default_namespace(), args.name)
        if args.command == "nodes":
            pod, nodes = ask_nodes(kube, body, api_key(kube, body["metadata"]["namespace"],
                                                       args.name))
    except (PluginError, ConfigException) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.command == "nodes":
        sys.stdout.write(json.dumps({"cluster": args.name, "pod": pod, "nodes": nodes},
                                    indent=2, sort_keys=True) + "\n"
                         if args.output == "json" else render_nodes(pod, nodes))
    elif args.output == "json":
        sys.stdout.write(as_json(body, args.command))
    else:
        sys.stdout.write((render_sites if args.command == "sites" else render_shards)(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
