"""Where the cluster's other nodes are: `cluster.discovery_strategy` turned into addresses.

`manual` gives none (peers come from `broker ctl cluster join` and the member list kept in
the data dir); `static` parses `cluster.static.seeds`; `dns` asks DNS every few seconds, so
a Kubernetes headless Service (with `publishNotReadyAddresses`, so peers are listed before
they are Ready) is the member list's source: A records on `rpc.tcp_server_port`, or SRV
records with their own ports. A failed lookup gives no seeds this round, never an error:
the links already up stay up.
"""

import logging
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.rdatatype
import dns.resolver

from broker.config.loader import Config
from broker.config.values import split_node_name

log = logging.getLogger(__name__)

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Discovery:
    strategy: str
    static_seeds: tuple[tuple[str, int | None], ...] = ()
    dns_name: str = ""
    record_type: str = "a"
    nameservers: tuple[tuple[str, int | None], ...] = ()

    @classmethod
    def from_config(cls, config: Config) -> "Discovery":
        return cls(
            config["cluster.discovery_strategy"],
            tuple(split_node_name(name) for name in config["cluster.static.seeds"]),
            config["cluster.dns.name"], config["cluster.dns.record_type"],
            config["cluster.dns.nameservers"],
        )

    async def seeds(self, default_port: int) -> list[Address]:
        if self.strategy == "static":
            return [(host, port or default_port) for host, port in self.static_seeds]
        if self.strategy == "dns" and self.dns_name:
            try:
                return await self._resolve(default_port)
            except (dns.exception.DNSException, OSError) as error:
                log.warning("cluster discovery: looking up %s (%s) failed: %s", self.dns_name,
                            self.record_type.upper(), error)
        return []

    async def _resolve(self, default_port: int) -> list[Address]:
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
