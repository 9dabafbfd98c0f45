"""`kubectl mqtt`: a cluster's sites, shards and pending transitions, from its status, and
what its brokers see: members, clients, durable sessions, durable shared groups, generations;
and its backups (plugin_backups.py).

kubectl runs any `kubectl-mqtt` on PATH as `kubectl mqtt`; `sites` and `shards` read the
MQTTCluster the operator maintains (no broker access needed), in the layout of `emqx ctl ds
info` so EMQX users read it at a glance. `nodes`, `clients`, `groups`, `sessions` and
`generations` ask the brokers' HTTP API through the API server's pod proxy (plugin_ask.py):
`nodes`, `clients` and `groups` one broker, which answers for the whole cluster; `sessions`
and `generations` every broker, since each answers for the durable sessions it hosts and the
shard replicas it holds.
"""

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from mqtt_operator import constants as c
from mqtt_operator import plugin_backups
from mqtt_operator.kube import Kube, client_from_environment, path
from mqtt_operator.plugin_ask import Brokers, PluginError, refused
from mqtt_operator.plugin_ask import table as _table

_NODE_KEYS = frozenset({"node", "site", "node_status"})  # what every /api/v5/nodes entry has
CLIENTS_PATH = "/api/v5/clients"
SESSIONS_PATH = "/api/v5/durable_sessions"
STORAGES_PATH = "/api/v5/ds/storages"
GROUPS_PATH = "/api/v5/durable_shared_groups"
_ALL = {"limit": "10000"}  # the brokers' largest page
_PROTOCOLS = {3: "3.1", 4: "3.1.1", 5: "5.0"}


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
        raise refused(error, f"MQTTCluster {namespace}/{name}",
                      f"get {c.PLURAL} -n {namespace}") from None
    except urllib3.exceptions.HTTPError as error:
        raise PluginError(f"cannot reach the API server: {error}") from None
    return dict(body)


def _shard_key(shard: str) -> str:
    return f"{c.DB}/{shard}"


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
    gone = status.get("goneSites")
    if gone:
        lines += ["", "GONE WITH THEIR VOLUMES (leaving the Durable Storage groups): "
                      + " ".join(gone)]
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
        document.update(sites=status.get("sites") or [], drain=status.get("drain"),
                        goneSites=status.get("goneSites") or [])
    return json.dumps(document, indent=2, sort_keys=True) + "\n"



def _is_nodes(answer: Any) -> bool:
    return isinstance(answer, list) and all(
        isinstance(node, dict) and node.keys() >= _NODE_KEYS for node in answer)


def _is_page(answer: Any) -> bool:
    """EMQX's paging envelope of client-like items (`data` + `meta`)."""
    return (isinstance(answer, dict) and isinstance(answer.get("meta"), dict)
            and isinstance(answer.get("data"), list)
            and all(isinstance(item, dict) and "clientid" in item for item in answer["data"]))


def _is_storages(answer: Any) -> bool:
    return isinstance(answer, dict) and isinstance(answer.get("databases"), list)


def _is_groups(answer: Any) -> bool:
    """The durable shared groups' envelope: `data` of groups, each with its members."""
    return (isinstance(answer, dict) and isinstance(answer.get("data"), list)
            and all(isinstance(item, dict) and {"group", "filter"} <= item.keys()
                    and isinstance(item.get("members", []), list) for item in answer["data"]))


def _count(value: Any) -> str:
    return "-" if value is None else str(value)


def render_clients(pod: str, page: Mapping[str, Any]) -> str:
    """`emqx ctl clients list` as a table: connected clients and the sessions kept for
    those away, of every node."""
    clients = page["data"]
    rows = [("CLIENT ID", "NODE", "STATE", "PROTO", "DURABLE", "SUBS", "INFLIGHT", "QUEUED")]
    rows += [(item["clientid"], item["node"],
              "connected" if item.get("connected") else "disconnected",
              _PROTOCOLS.get(item.get("proto_ver") or 0, "-"),
              "yes" if item.get("durable") else "no", _count(item.get("subscriptions_cnt")),
              _count(item.get("inflight_cnt")), _count(item.get("mqueue_len")))
             for item in clients]
    lines = [f"CLIENTS (as {pod} sees them):", *_table(rows)]
    total = page["meta"].get("count", len(clients))
    if total > len(clients):
        lines.append(f"(the first {len(clients)} of {total})")
    return "\n".join(lines) + "\n"


def render_groups(pod: str, page: Mapping[str, Any],
                  pods: Mapping[str, str] | None = None) -> str:
    """Durable shared groups (`$share/GROUP/FILTER` of durable sessions) of the whole
    cluster: MEMBERS connected/total, BACKLOG the stored messages the group has not read
    yet, NODES where its members' sessions are: the pod of each site the broker names
    (`pods`, from the cluster's status), else what it names."""
    groups = sorted(page["data"], key=lambda item: (item["group"], item["filter"]))
    rows = [("GROUP", "FILTER", "MEMBERS", "BACKLOG", "NODES")]
    for item in groups:
        members = [m for m in item.get("members") or [] if isinstance(m, dict)]
        connected = sum(1 for m in members if m.get("connected"))
        nodes = sorted({(pods or {}).get(str(m["node"]), str(m["node"]))
                        for m in members if m.get("node")})
        rows.append((item["group"], item["filter"], f"{connected}/{len(members)}",
                     _count(item.get("backlog")), " ".join(nodes) or "-"))
    lines = [f"DURABLE SHARED GROUPS (as {pod} sees them):", *_table(rows)]
    if not groups:
        lines.append("(none)")
    total = (page.get("meta") or {}).get("count", len(groups))
    if isinstance(total, int) and total > len(groups):
        lines.append(f"(the first {len(groups)} of {total})")
    return "\n".join(lines) + "\n"


def _expires_in(session: Mapping[str, Any]) -> str:
    """Counted by the broker's clock (`now` beside `expires_at`), not this machine's."""
    if session.get("connected"):
        return "-"
    if session.get("expires_at") is None:
        return "never"
    return _uptime(max(0, int((session["expires_at"] - session["now"]) * 1000)))


def merged_sessions(answers: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    return sorted((item for page in answers.values() for item in page["data"]),
                  key=lambda item: (item["clientid"], item["node"]))


def render_sessions(sessions: Sequence[Mapping[str, Any]]) -> str:
    """Durable sessions of every broker; MISSED: stored messages matching an away
    session's subscriptions since its client left ("+": the broker stopped counting)."""
    rows = [("CLIENT ID", "NODE", "STATE", "EXPIRES IN", "SUBS", "INFLIGHT", "LAG", "MISSED")]
    rows += [(item["clientid"], item["node"],
              "connected" if item.get("connected") else "disconnected", _expires_in(item),
              _count(item.get("subscriptions_cnt")), _count(item.get("inflight_cnt")),
              _count(item.get("checkpoint_lag")),
              _count(item.get("missed_cnt")) + ("+" if item.get("missed_capped") else ""))
             for item in sessions]
    return "\n".join(["DURABLE SESSIONS:", *_table(rows)]) + "\n"


def merged_generations(answers: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (shard, generation, state) of the messages database, with the pods
    that hold it: the brokers holding a shard's replicas report the same generations (a
    replica still catching up may report a generation as current that others sealed)."""
    merged: dict[tuple[int, int, str], dict[str, Any]] = {}
    for pod, storages in answers.items():
        for database in storages["databases"]:
            if database.get("name") != c.DB:
                continue
            for shard in database.get("shards") or []:
                for generation in shard.get("generations") or []:
                    key = (shard["shard"], generation["generation"], generation["state"])
                    entry = merged.setdefault(key, {"shard": shard["shard"], **generation,
                                                    "pods": []})
                    entry["pods"].append(pod)
    return [merged[key] for key in sorted(merged)]


def _time(microseconds: int | None) -> str:
    if not microseconds:
        return "-"
    return datetime.fromtimestamp(microseconds / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_generations(generations: Sequence[Mapping[str, Any]]) -> str:
    """Like the generations of `emqx ctl ds info`: time range, size and the pods holding
    each; sealed ones are what Spark jobs read."""
    rows = [("SHARD", "GENERATION", "STATE", "SINCE", "UNTIL", "MESSAGES", "BYTES", "PODS")]
    rows += [(_shard_key(str(g["shard"])), str(g["generation"]), g["state"],
              _time(g.get("since")), _time(g.get("until")), _count(g.get("messages")),
              _count(g.get("bytes")), " ".join(g["pods"])) for g in generations]
    return "\n".join(["GENERATIONS:", *_table(rows)]) + "\n"


def _dump(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def _from_one(brokers: Brokers, cluster: str, json_output: bool, url: str,
              valid: Callable[[Any], bool], query: Mapping[str, str] | None,
              render: Callable[[str, Any], str], field: str) -> str:
    pod, answer = brokers.first(url, valid, query)
    return (_dump({"cluster": cluster, "pod": pod, field: answer}) if json_output
            else render(pod, answer))


def _from_each(brokers: Brokers, cluster: str, json_output: bool, url: str,
               valid: Callable[[Any], bool], merge: Callable[[Any], list[dict[str, Any]]],
               render: Callable[[list[dict[str, Any]]], str], field: str) -> str:
    """Pods that did not answer are named on stderr (and under `unanswered`): what they
    host is missing from the list."""
    answers, failures = brokers.each(url, valid, _ALL)
    for failure in failures:
        print(f"warning: not listed: {failure}", file=sys.stderr)
    items = merge(answers)
    return (_dump({"cluster": cluster, field: items, "unanswered": failures}) if json_output
            else render(items))


def ask_brokers(kube: Kube, body: Mapping[str, Any], verb: str, json_output: bool) -> str:
    brokers, cluster = Brokers(kube, body), body["metadata"]["name"]
    if verb == "nodes":
        return _from_one(brokers, cluster, json_output, c.NODES_PATH, _is_nodes, None,
                         render_nodes, "nodes")
    if verb == "clients":
        return _from_one(brokers, cluster, json_output, CLIENTS_PATH, _is_page, _ALL,
                         render_clients, "clients")
    if verb == "groups":
        pods = {site["id"]: site["pod"] for site in body["status"]["sites"] if "id" in site}
        return _from_one(brokers, cluster, json_output, GROUPS_PATH, _is_groups, None,
                         lambda pod, page: render_groups(pod, page, pods), "groups")
    if verb == "sessions":
        return _from_each(brokers, cluster, json_output, SESSIONS_PATH, _is_page,
                          merged_sessions, render_sessions, "sessions")
    return _from_each(brokers, cluster, json_output, STORAGES_PATH, _is_storages,
                      merged_generations, render_generations, "generations")


_VERBS = {
    "sites": "sites with pod and up/down, shards, transitions",
    "shards": "shards with their replica sites, replicas per site",
    "nodes": "cluster members as a broker sees them (pod proxy)",
    "clients": "connected clients and kept sessions, as a broker sees them (pod proxy)",
    "sessions": "durable sessions of every broker: expiry, lag, missed messages (pod proxy)",
    "groups": "durable shared groups: members connected/total, backlog, nodes (pod proxy)",
    "generations": "generations of every shard replica: state, time range, size (pod proxy)",
    "backups": "archives on record, the backup schedule and its last run, the restore",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kubectl mqtt", description="Inspect an MQTTCluster and what its brokers see")
    commands = parser.add_subparsers(dest="command", required=True)
    for command, text in _VERBS.items():
        sub = commands.add_parser(command, help=text)
        sub.add_argument("name", help="MQTTCluster name")
        sub.add_argument("-n", "--namespace", help="namespace (default: the context's)")
        sub.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    json_output = args.output == "json"
    try:
        kube = Kube(client_from_environment())
        body = fetch(kube, args.namespace or _default_namespace(), args.name)
        if args.command == "backups":
            job = plugin_backups.cronjob(kube, body["metadata"]["namespace"], args.name)
            output = (plugin_backups.backups_json if json_output
                      else plugin_backups.render_backups)(body, job)
        elif args.command in ("sites", "shards"):
            output = (as_json(body, args.command) if json_output else
                      (render_sites if args.command == "sites" else render_shards)(body))
        else:
            output = ask_brokers(kube, body, args.command, json_output)
    except (PluginError, ConfigException) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
