"""The MQTTCluster status the operator writes: sites, conditions, phase.

Pure, so what `kubectl get mqc` and `kubectl mqtt sites` show is decided in one place and
tested without a cluster.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PodView:
    name: str
    ready: bool
    ip: str | None


def by_ordinal(objects: Sequence[Mapping[str, Any]], cluster: str, prefix: str = ""
               ) -> dict[int, Mapping[str, Any]]:
    """The StatefulSet's pods (or, with prefix `data-`, their claims) by ordinal: the
    name's suffix."""
    found = {}
    for item in objects:
        base, _, ordinal = item["metadata"]["name"].removeprefix(prefix).rpartition("-")
        if base == cluster and ordinal.isdigit():
            found[int(ordinal)] = item
    return found


def pod_views(pods: Sequence[Mapping[str, Any]], cluster: str) -> dict[int, PodView]:
    views = {}
    for ordinal, pod in by_ordinal(pods, cluster).items():
        status = pod.get("status") or {}
        ready = any(cond.get("type") == "Ready" and cond.get("status") == "True"
                    for cond in status.get("conditions") or ())
        views[ordinal] = PodView(pod["metadata"]["name"], ready, status.get("podIP"))
    return views


def sites(ids: Mapping[int, str], members: int, pods: Mapping[int, PodView],
          cluster: str) -> list[dict[str, Any]]:
    """The member sites (ordinal < members) with their pod and whether it is up."""
    return [
        {"ordinal": ordinal, "id": ids[ordinal], "pod": f"{cluster}-{ordinal}",
         "state": "up" if ordinal in pods and pods[ordinal].ready else "down"}
        for ordinal in range(members)
    ]


def condition(previous: Sequence[Mapping[str, Any]], kind: str, ok: bool, reason: str,
              message: str, now: str) -> dict[str, Any]:
    """A condition whose lastTransitionTime moves only when its status flips."""
    status = "True" if ok else "False"
    old = next((c for c in previous if c.get("type") == kind), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status else now
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since}


def phase(ready: int, replicas: int, draining: bool, degraded: bool) -> str:
    if draining:
        return "Draining"
    if degraded:
        return "Degraded"
    if ready >= replicas:
        return "Running"
    return "Pending" if ready == 0 else "Scaling"


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning `old` into `new` for the keys `new` sets: maps inside get
    null for keys that disappeared (a plain merge would keep a removed site's entry)."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value)
            inner.update({gone: None for gone in before if gone not in value})
            patch[key] = inner
        else:
            patch[key] = value
    return patch
