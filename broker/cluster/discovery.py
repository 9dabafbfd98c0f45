"""Where the cluster's other nodes are: `cluster.discovery_strategy` turned into addresses.

`manual` gives none (peers come from `broker ctl cluster join` and the member list kept in
the data dir); `static` parses `cluster.static.seeds`; `dns` asks DNS every few seconds, so
a Kubernetes headless Service (with `publishNotReadyAddresses`, so peers are listed before
they are Ready) is the member list's source: A records on `rpc.tcp_server_port`, or SRV
records with their own ports. `k8s` (EMQX's strategy of that name) reads the same
Service's Endpoints from the Kubernetes API with the pod's service account: no cluster DNS
needed, and no DNS cache between a new pod and its peers. A failed lookup gives no seeds
this round, never an error: the links already up stay up.

dnspython and aiohttp's client are imported by the strategies that use them: together they
would cost every other node a third of a second of start-up.
"""

import logging
import os
import ssl
from pathlib import Path
from typing import Any, NamedTuple

from broker.config.loader import Config
from broker.config.values import split_node_name

log = logging.getLogger(__name__)

Address = tuple[str, int]

# Where Kubernetes mounts a pod's service account: its token (re-read for every lookup, as
# the kubelet rotates it) and the cluster's CA.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The Endpoints port whose number a peer listens on (the operator's headless Service names
# the inter-node port so); like an SRV record, it travels with each pod during a rollout
# that changes the port. Without one, peers listen on `rpc.tcp_server_port`.
RPC_PORT_NAME = "rpc"


class Discovery(NamedTuple):
    strategy: str
    static_seeds: tuple[tuple[str, int | None], ...] = ()
    dns_name: str = ""
    record_type: str = "a"
    nameservers: tuple[tuple[str, int | None], ...] = ()
    k8s: "K8sEndpoints | None" = None

    @classmethod
    def from_config(cls, config: Config) -> "Discovery":
        return cls(
            config["cluster.discovery_strategy"],
            tuple(split_node_name(name) for name in config["cluster.static.seeds"]),
            config["cluster.dns.name"], config["cluster.dns.record_type"],
            config["cluster.dns.nameservers"],
            K8sEndpoints.from_config(config),
        )

    async def seeds(self, default_port: int) -> list[Address]:
        if self.strategy == "static":
            return [(host, port or default_port) for host, port in self.static_seeds]
        if self.strategy == "dns" and self.dns_name:
            return await self._lookup(default_port)
        if self.strategy == "k8s" and self.k8s is not None:
            return await self.k8s.seeds(default_port)
        return []

    async def _lookup(self, default_port: int) -> list[Address]:
        import dns.exception

        try:
            return await self._resolve(default_port)
        except (dns.exception.DNSException, OSError) as error:
            log.warning("cluster discovery: looking up %s (%s) failed: %s", self.dns_name,
                        self.record_type.upper(), error)
            return []

    async def _resolve(self, default_port: int) -> list[Address]:
        import dns.asyncresolver
        import dns.rdatatype
        import dns.resolver

        resolver = dns.asyncresolver.Resolver(configure=not self.nameservers)
        if self.nameservers:
            resolver.nameservers = [host for host, _ in self.nameservers]
            resolver.port = self.nameservers[0][1] or 53
        resolver.lifetime = 3.0
        if self.record_type == "srv":
            answer = await resolver.resolve(self.dns_name, dns.rdatatype.SRV)
            return sorted((str(r.target).rstrip("."), int(r.port)) for r in answer)
        addresses: list[Address] = []
        for rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            try:
                answer = await resolver.resolve(self.dns_name, rdtype)
            except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
                continue
            addresses += [(r.address, default_port) for r in answer]
        return sorted(addresses)


class K8sEndpoints(NamedTuple):
    """The peers in the Endpoints of `cluster.k8s.service_name`, as EMQX's `k8s` strategy
    finds them: every address of every subset, ready or not (a peer is not Ready before it
    has joined, so a Service without `publishNotReadyAddresses` still lists it under
    `notReadyAddresses`), named as `cluster.k8s.address_type` says."""

    apiserver: str
    service_name: str
    namespace: str
    address_type: str = "ip"
    suffix: str = "pod.local"
    account_dir: Path = SERVICE_ACCOUNT_DIR
    timeout: float = 3.0

    @classmethod
    def from_config(cls, config: Config) -> "K8sEndpoints":
        return cls(config["cluster.k8s.apiserver"] or in_cluster_apiserver(),
                   config["cluster.k8s.service_name"], config["cluster.k8s.namespace"],
                   config["cluster.k8s.address_type"], config["cluster.k8s.suffix"])

    @property
    def url(self) -> str:
        return (f"{self.apiserver.rstrip('/')}/api/v1/namespaces/{self.namespace}"
                f"/endpoints/{self.service_name}")

    async def seeds(self, default_port: int) -> list[Address]:
        import aiohttp

        try:
            return self.addresses(await self._get(), default_port)
        except (aiohttp.ClientError, OSError, ValueError, KeyError, TypeError) as error:
            log.warning("cluster discovery: reading %s failed: %r", self.url, error)
            return []

    async def _get(self) -> dict[str, Any]:
        import aiohttp

        token_file = self.account_dir / "token"
        headers = {"Accept": "application/json"}
        if token_file.exists():
            headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
        ca_file = self.account_dir / "ca.crt"
        context = ssl.create_default_context(cafile=ca_file if ca_file.exists() else None)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session, \
                session.get(self.url, ssl=context) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}: {(await response.text())[:200]}")
            body: dict[str, Any] = await response.json()
            return body

    def addresses(self, endpoints: dict[str, Any], default_port: int) -> list[Address]:
        found: set[Address] = set()
        for subset in endpoints.get("subsets") or []:
            port = next((p["port"] for p in subset.get("ports") or []
                         if p.get("name") == RPC_PORT_NAME), default_port)
            for address in [*(subset.get("addresses") or []),
                            *(subset.get("notReadyAddresses") or [])]:
                found.add((self._host(address), int(port)))
        return sorted(found)

    def _host(self, address: dict[str, Any]) -> str:
        if self.address_type == "dns":
            dashed = address["ip"].replace(".", "-").replace(":", "-")
            return f"{dashed}.{self.namespace}.{self.suffix}"
        if self.address_type == "hostname":
            return f"{address['hostname']}.{self.service_name}.{self.namespace}.{self.suffix}"
        return str(address["ip"])


def in_cluster_apiserver() -> str:
    """The API server a pod runs under, from the variables Kubernetes sets in every pod
    (what client libraries' in-cluster configuration uses): no DNS name to resolve."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
