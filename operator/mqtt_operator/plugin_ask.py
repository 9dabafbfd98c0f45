"""How `kubectl mqtt` asks the brokers: through the API server's pod proxy, with the viewer
key of the cluster's Secret `<name>-api-key`.

The proxy works from wherever kubectl does, pod network or not, with no port-forward; the
user needs `get` on that Secret and on `pods/proxy`. The key travels as `X-Api-Key`, because
the API server removes `Authorization` from what it proxies (it carried the user's own
credentials). A broker's refusal (EMQX's `{"code", "message"}`) is told apart from the API
server's (a Kubernetes `Status`): only the latter is about the user's permissions.
"""

import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from mqtt_operator import constants as c
from mqtt_operator.kube import Kube, path


class PluginError(Exception):
    pass


KEY_HEADER = "X-Api-Key"  # the brokers' other way to take a key (broker/http/auth.py)
# Whether an answer has the shape the verb reads; a broker of another version may not.
Valid = Callable[[Any], bool]
Query = Mapping[str, str] | None


def why(error: ApiException) -> str:
    """The API server's own message (e.g. why it cannot proxy to a pod), else the reason."""
    try:
        return str(json.loads(error.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(error.reason)


def refused(error: ApiException, what: str, check: str) -> PluginError:
    """The API server's refusal as the user should read it: which permission to check."""
    if error.status in (401, 403):
        return PluginError(f"no access to {what} ({error.status} {error.reason});"
                           f" check: kubectl auth can-i {check}")
    return PluginError(f"API server error {error.status}: {why(error)}")


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, the last one unpadded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
            .rstrip() for row in rows]


def api_key(kube: Kube, namespace: str, cluster: str) -> str | None:
    """KEY:SECRET of the cluster's viewer key; None when there is no Secret (a cluster of
    contract v2, whose brokers ask for no key)."""
    name = c.api_key_secret_name(cluster)
    try:
        secret = kube.get(path("v1", "Secret", namespace, name))
    except ApiException as error:
        raise refused(error, f"Secret {namespace}/{name}, the brokers' API key",
                      f"get secret/{name} -n {namespace}") from None
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
    try:
        return bool(json.loads(error.body or "").get("kind") == "Status")
    except (ValueError, AttributeError):
        return True


class Brokers:
    """The members of one MQTTCluster (`status.sites`), asked through the pod proxy:
    Ready ones first, then the others by ordinal, since a broker that has not joined yet
    still answers, and a cluster whose pods never become Ready is when the brokers' view is
    wanted most."""

    def __init__(self, kube: Kube, body: Mapping[str, Any]) -> None:
        self.kube = kube
        self.namespace = body["metadata"]["namespace"]
        self.port = body["spec"]["listeners"]["httpPort"]
        members = (body.get("status") or {}).get("sites") or []
        if not members:
            raise PluginError("no status yet: is the operator running?")
        self.pods = [site["pod"] for site in sorted(  # stable: by ordinal within each
            members, key=lambda site: site["state"] != "up")]
        self.key = api_key(kube, self.namespace, body["metadata"]["name"])

    def _ask(self, pod: str, url: str, valid: Valid, query: Query) -> tuple[Any, str]:
        """(the answer, "") or (None, why this pod gave none)."""
        proxied = f"/api/v1/namespaces/{self.namespace}/pods/{pod}:{self.port}/proxy{url}"
        try:
            answer = self.kube.request("GET", proxied, query=query,
                                       headers={KEY_HEADER: self.key} if self.key else None)
        except ApiException as error:
            if error.status in (401, 403) and _from_api_server(error):
                raise PluginError(
                    f"no access to pod {self.namespace}/{pod} through the API server's proxy"
                    f" ({error.status} {error.reason}); check: kubectl auth can-i get"
                    f" pods --subresource=proxy -n {self.namespace}") from None
            return None, f"{pod}: {error.status} {why(error)}"
        except ValueError as error:  # not JSON
            return None, f"{pod}: unreadable answer: {error}"
        except urllib3.exceptions.HTTPError as error:
            raise PluginError(f"cannot reach the API server: {error}") from None
        if not valid(answer):
            return None, f"{pod}: unreadable answer: not what GET {url} returns"
        return answer, ""

    def first(self, url: str, valid: Valid, query: Query = None) -> tuple[str, Any]:
        """(the pod that answered, its answer): for what any broker answers for all."""
        failures = []
        for pod in self.pods:
            answer, failure = self._ask(pod, url, valid, query)
            if not failure:
                return pod, answer
            failures.append(failure)
        raise PluginError(f"no broker answered GET {url}: " + "; ".join(failures))

    def each(self, url: str, valid: Valid, query: Query = None
             ) -> tuple[dict[str, Any], list[str]]:
        """(pod -> answer, why the others gave none), by ordinal: for what each broker
        answers for itself. Fails only when none answered."""
        answers, failures = {}, []
        for pod in sorted(self.pods, key=lambda pod: int(pod.rsplit("-", 1)[1])):
            answer, failure = self._ask(pod, url, valid, query)
            if failure:
                failures.append(failure)
            else:
                answers[pod] = answer
        if not answers:
            raise PluginError(f"no broker answered GET {url}: " + "; ".join(failures))
        return answers, failures
