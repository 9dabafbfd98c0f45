"""What the operator asks the brokers (docs/operator-contract.md, section 4): which shard
replicas a site holds, and which generations a broker has sealed (what the Spark jobs may
read).

`GET /api/v5/ds/sites/{site}` on the site's own pod answers EMQX's shape,
`{"up": bool, "shards": [{"storage": "messages", "id": "3", ...}]}`. Every call carries the
viewer key of the cluster's API key Secret as HTTP Basic (contract v3). A pod without an IP,
a refused connection, a timeout or any non-200 answer (a broker version that does not serve
the endpoint yet, a key it does not know: 401) all count as unreachable: the reconcile
records that and applies the documented policy instead of hanging on it.
"""

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mqtt_operator import constants
from mqtt_operator.placement import Transition

Credentials = tuple[str, str] | None  # (key, secret); None: ask without (no usable Secret)


@dataclass(frozen=True)
class SiteReport:
    site: str
    shards: frozenset[int] | None  # None: the broker could not be asked
    error: str = ""

    @property
    def reachable(self) -> bool:
        return self.shards is not None


def _get_json(host: str | None, port: int, path: str, credentials: Credentials,
              timeout: float) -> tuple[Any, str]:
    """(body, "") or (None, why the broker counts as unreachable)."""
    if not host:
        return None, "pod has no IP"
    url = f"http://{host}:{port}{path}"
    request = urllib.request.Request(url)
    if credentials is not None:
        pair = ":".join(credentials).encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(pair).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response), ""
    except urllib.error.HTTPError as error:  # e.g. 404: this broker does not serve it yet
        return None, f"GET {url}: HTTP {error.code}"
    except (OSError, ValueError) as error:
        return None, f"GET {url}: {getattr(error, 'reason', None) or error}"


def ask_site(host: str | None, port: int, site: str, credentials: Credentials,
             timeout: float) -> SiteReport:
    body, error = _get_json(host, port, f"/api/v5/ds/sites/{site}", credentials, timeout)
    try:
        return SiteReport(site, None if body is None else frozenset(
            int(shard["id"]) for shard in body.get("shards", ())
            if shard.get("storage", constants.DB) == constants.DB), error)
    except (ValueError, KeyError, TypeError, AttributeError) as bad:
        return SiteReport(site, None, f"/api/v5/ds/sites/{site}: unreadable answer: {bad!r}")


def ask_sealed(host: str | None, port: int, credentials: Credentials,
               timeout: float) -> frozenset[tuple[int, int]] | None:
    """The (shard, generation) pairs of the messages database this broker has sealed, from
    `GET /api/v5/ds/storages`; None when it cannot be asked (the reconcile then launches
    nothing for data only that broker holds, and asks again next time)."""
    body, _error = _get_json(host, port, "/api/v5/ds/storages", credentials, timeout)
    try:
        return None if body is None else frozenset(
            (int(shard["shard"]), int(generation["generation"]))
            for database in body["databases"] if database.get("name") == constants.DB
            for shard in database["shards"] for generation in shard["generations"]
            if generation.get("state") == "sealed")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class DrainVerdict:
    proceed: bool
    reason: str
    message: str


def drain_verdict(reports: Sequence[SiteReport], require_confirmation: bool) -> DrainVerdict:
    """Shrink only when no leaving site still holds a replica it could tell us about.

    An unreachable broker cannot confirm, but scaling down keeps its volume (and so its data
    and site ID), so by default the operator proceeds and says so; with
    spec.scaleDown.requireDrainConfirmation it waits instead.
    """
    holding = [r for r in reports if r.reachable and r.shards]
    if holding:
        detail = "; ".join(f"{r.site} holds shards {sorted(r.shards or ())}" for r in holding)
        return DrainVerdict(False, "DrainPending", f"waiting for replicas to move: {detail}")
    silent = [r for r in reports if not r.reachable]
    if not silent:
        return DrainVerdict(True, "DrainConfirmed", "leaving sites hold no shard replicas")
    detail = "; ".join(f"{r.site}: {r.error}" for r in silent)
    if require_confirmation:
        return DrainVerdict(False, "DrainUnconfirmed",
                            f"waiting: requireDrainConfirmation and unreachable {detail}")
    return DrainVerdict(True, "DrainUnconfirmed",
                        f"proceeding without confirmation (volumes are kept): {detail}")


def still_held(report: SiteReport) -> bool:
    """Whether a site gone with its volume must stay listed as leaving: until a broker that
    answers reports it in no shard's group (a silent one tells nothing)."""
    return not report.reachable or bool(report.shards)


def settled(transition: Transition, reports: Mapping[str, SiteReport],
            members: Collection[str]) -> bool:
    """Done when every added site reports the shard and no removed member site does (a site
    that has left the cluster holds nothing any more)."""
    def holds(site: str) -> bool | None:
        report = reports.get(site)
        return None if report is None or report.shards is None else transition.shard in (
            report.shards)

    return (all(holds(site) is True for site in transition.add)
            and all(holds(site) is False for site in transition.remove if site in members))
