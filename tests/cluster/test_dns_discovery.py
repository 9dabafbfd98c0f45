"""`cluster.discovery_strategy = dns` against a DNS server the test runs (UDP, loopback).

The server answers from a table the test controls, like a Kubernetes headless Service:
A records (every node on one port, each on its own loopback address) or SRV records (host
and port per node).
"""

import socket
import threading
from collections.abc import Iterator

import dns.message
import dns.rdatatype
import dns.rrset
import pytest

from tests.cluster.conftest import Cluster, free_port

NAME = "mqtt-headless.test."


class TinyDNS:
    def __init__(self) -> None:
        self.records: dict[int, list[str]] = {}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.queries = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            query = dns.message.from_wire(data)
            response = dns.message.make_response(query)
            question = query.question[0]
            values = self.records.get(question.rdtype, []) if str(question.name) == NAME else []
            if values:
                response.answer.append(dns.rrset.from_text_list(
                    question.name, 5, "IN", dns.rdatatype.to_text(question.rdtype), values))
            self.queries += 1
            self.sock.sendto(response.to_wire(), peer)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def tiny_dns() -> Iterator[TinyDNS]:
    server = TinyDNS()
    yield server
    server.close()


def test_srv_records_name_every_node(cluster: Cluster, tiny_dns: TinyDNS) -> None:
    nodes = cluster.make(3, **{"cluster.discovery_strategy": "dns",
                               "cluster.dns.name": NAME, "cluster.dns.record_type": "srv",
                               "cluster.dns.nameservers": f"127.0.0.1:{tiny_dns.port}"})
    tiny_dns.records[dns.rdatatype.SRV] = [f"0 0 {n.rpc_port} 127.0.0.1." for n in nodes]
    for node in nodes:
        node.start()
    cluster.all_running(nodes)
    assert tiny_dns.queries >= 3


def test_a_records_name_every_node_on_the_shared_port(cluster: Cluster, tiny_dns: TinyDNS) -> None:
    port = free_port()
    settings = {"cluster.discovery_strategy": "dns", "cluster.dns.name": NAME,
                "cluster.dns.record_type": "a", "rpc.tcp_server_port": str(port),
                "cluster.dns.nameservers": f"127.0.0.1:{tiny_dns.port}"}
    nodes = cluster.make(3, **settings)
    for index, node in enumerate(nodes, start=1):
        address = f"127.0.0.{index + 10}"
        node.settings.update({"rpc.listen_address": address, "rpc.tcp_server_port": str(port),
                              "node.name": f"{node.name}@{address}"})
    tiny_dns.records[dns.rdatatype.A] = [f"127.0.0.{i + 10}" for i in range(1, 4)]
    for node in nodes:
        node.start()
    expected = {f"{n.name}@127.0.0.{i + 10}": "running" for i, n in enumerate(nodes, start=1)}
    cluster.wait_statuses(nodes, expected)
