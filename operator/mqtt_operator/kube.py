"""A narrow Kubernetes API wrapper: JSON in, JSON out, server-side apply for children.

Plain dicts rather than the client's generated models, because the manifests are dicts and
server-side apply of a dict is idempotent: re-applying after an operator restart writes
nothing and can never create a second copy of a child.
"""

import json
import os
from collections.abc import Mapping
from typing import Any

import kubernetes
import urllib3
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from mqtt_operator import constants

# apiVersion/kind -> URL segment; only the kinds the operator creates or reads.
_PLURALS = {
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Pod": "pods",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "StatefulSet": "statefulsets",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ServiceMonitor": "servicemonitors",
    "SparkApplication": "sparkapplications",
    "Job": "jobs",
    "CronJob": "cronjobs",
    constants.KIND: constants.PLURAL,
}


def client_from_environment() -> ApiClient:
    """In-cluster credentials when running in a pod, else KUBECONFIG / ~/.kube/config.

    KUBECONFIG is read now, not when the client library was imported (its default is frozen
    at import), so one process can switch identities, as the tests do.
    """
    configuration = Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"),
                                           client_configuration=configuration)
    if not configuration.verify_ssl:  # the kubeconfig chose this; kubectl does not nag either
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return ApiClient(configuration)


def in_cluster_server() -> str | None:
    """The API server's URL from the variables Kubernetes sets in every pod (None outside
    one): an IP, so it needs no cluster DNS."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
        "KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def path(api_version: str, kind: str, namespace: str, name: str = "") -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{_PLURALS[kind]}" + (f"/{name}" if name else "")


class Kube:
    def __init__(self, client: ApiClient, timeout: float = 10.0) -> None:
        self.client = client
        self.timeout = timeout

    def request(self, method: str, url: str, body: Any = None, content_type: str | None = None,
                query: Mapping[str, str] | None = None,
                headers: Mapping[str, str] | None = None) -> Any:
        """`headers` travel on to a pod through the pod proxy (all but `Authorization`,
        which the API server takes for its own and removes)."""
        headers = {**(headers or {}), "Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        method, full_url, headers, body, _ = self.client.param_serialize(
            method, url, query_params=list((query or {}).items()), header_params=headers,
            body=body, auth_settings=["BearerToken"])
        response = self.client.call_api(method, full_url, header_params=headers, body=body,
                                        _request_timeout=self.timeout)
        data = response.read()
        if response.status >= 400:
            raise ApiException(status=response.status, reason=response.reason,
                               http_resp=response)
        return json.loads(data) if data else None

    def get(self, url: str) -> Any | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", url)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def served(self, group_version: str) -> bool:
        """Discovery: is this API group/version served (e.g. a CRD installed)?"""
        return self.get(f"/apis/{group_version}") is not None

    def serves(self, group_version: str, resource: str) -> bool:
        """Discovery: is this resource (plural) served in that group/version?"""
        found = self.get(f"/apis/{group_version}")
        return found is not None and any(
            served.get("name") == resource for served in found.get("resources") or [])

    def apply(self, manifest: Mapping[str, Any]) -> Any:
        meta = manifest["metadata"]
        url = path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        return self.request("PATCH", url, body=manifest,
                            content_type="application/apply-patch+yaml",
                            query={"fieldManager": constants.FIELD_MANAGER, "force": "true"})

    def create(self, manifest: Mapping[str, Any], dry_run: bool = False) -> bool:
        """Creates the object unless one of that name exists; whether it was (or, dry run,
        would be) created. For what must be written once and never again, which apply cannot
        express; needs only the `create` verb, so existence is learnt without `get`."""
        meta = manifest["metadata"]
        try:
            self.request("POST", path(manifest["apiVersion"], manifest["kind"],
                                      meta["namespace"]),
                         body=manifest, content_type="application/json",
                         query={"fieldManager": constants.FIELD_MANAGER,
                                **({"dryRun": "All"} if dry_run else {})})
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    def delete(self, url: str) -> None:
        """Gone already counts as done: another reconcile or the GC may have been first."""
        try:
            self.request("DELETE", url)
        except ApiException as error:
            if error.status != 404:
                raise

    def annotate(self, api_version: str, kind: str, namespace: str, name: str,
                 annotations: Mapping[str, str]) -> None:
        """A merge patch, not apply: apply would create an object gone meanwhile (a pod the
        StatefulSet replaced), and gone counts as done."""
        try:
            self.request("PATCH", path(api_version, kind, namespace, name),
                         body={"metadata": {"annotations": dict(annotations)}},
                         content_type="application/merge-patch+json")
        except ApiException as error:
            if error.status != 404:
                raise

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> Any:
        url = path(constants.API_VERSION, constants.KIND, namespace, name) + "/status"
        return self.request("PATCH", url, body={"status": status},
                            content_type="application/merge-patch+json")

    def list(self, api_version: str, kind: str, namespace: str,
             selector: Mapping[str, str]) -> list[dict[str, Any]]:
        label_selector = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
        result = self.request("GET", path(api_version, kind, namespace),
                              query={"labelSelector": label_selector})
        return list(result["items"])
