"""Routing across nodes: announces this node's routes, keeps the others', forwards.

The glue between the node's router and the cluster links. A subscription added or removed
here becomes a route announcement, batched per event-loop turn; a publish here is forwarded
once per node with a matching route (plus the shared-group picks that fell on that node's
members); a forwarded message is delivered to local subscribers only, never forwarded again.
Retained messages are not forwarded: they go through the metadata Raft group
(broker/cluster/metadata.py), which every node applies to its own store. Non-durable
subscribers on a node that dies lose what was in flight to it, as in EMQX; durable sessions
keep what their node stored.
"""

import asyncio
import logging
from typing import Any, Protocol

from broker.cluster.forward import (
    PLAIN,
    ForwardError,
    decode_frame,
    encode_entry,
    encode_message,
)
from broker.cluster.frames import Channel
from broker.cluster.routes import LocalRoutes, RemoteRoutes, RouteError
from broker.cluster.service import Cluster
from broker.routing.router import Forwards, RemoteShared, Router
from broker.session.message import Message

log = logging.getLogger(__name__)


class PeerTraffic:
    """Counters for /metrics (a plain class: a dataclass costs a start ~0.7 ms, issue 42)."""

    __slots__ = ("bytes_out", "messages_in", "messages_out")

    def __init__(self) -> None:
        self.messages_out = 0
        self.bytes_out = 0
        self.messages_in = 0


class RoutedNode(Protocol):
    """What cluster routing needs of its node (broker/node.py's Node is one): the router
    whose route changes go to the peers, and where messages forwarded by them go."""

    router: Router

    def deliver_forwarded(self, message: Message, plain: bool,
                          targets: list[tuple[str, str, str]]) -> None: ...


class ClusterRouting:
    """Announces this node's routes to its peers and forwards to theirs. (A plain class, as
    PeerTraffic: a dataclass costs a start ~0.5 ms, issue 42.)"""

    __slots__ = ("_outbox", "_scheduled", "cluster", "garbled", "local", "node", "remote",
                 "traffic")

    def __init__(self, node: RoutedNode, cluster: Cluster) -> None:
        self.node = node
        self.cluster = cluster
        self.local = LocalRoutes()
        self.remote = RemoteRoutes()
        self.traffic: dict[str, PeerTraffic] = {}
        self.garbled = 0
        self._outbox: dict[str, list[bytes]] = {}
        self._scheduled = False
        node.router.listener = self.route_changed
        cluster.on(Channel.ROUTES, self._routes_frame)
        cluster.on(Channel.FORWARD, self._forward_frame)
        cluster.on_peer_up(self._peer_up)
        cluster.on_peer_down(self._peer_down)

    # ---- routes -------------------------------------------------------------------------------
    def route_changed(self, topic_filter: str, group: str | None, client_id: str,
                      added: bool) -> None:
        (self.local.add if added else self.local.remove)(topic_filter, group, client_id)
        self._soon()

    def _peer_up(self, site: str) -> None:
        self.cluster.send(site, Channel.ROUTES, self.local.full_set())

    def _peer_down(self, site: str) -> None:
        purged = self.remote.purge(site)
        self._outbox.pop(site, None)
        if purged:
            log.info("purged %d routes of %s", purged, site)

    def _routes_frame(self, site: str, payload: bytes) -> None:
        if payload == b'{"resync":true}':
            self.cluster.send(site, Channel.ROUTES, self.local.full_set())
            return
        try:
            in_order = self.remote.receive(site, payload)
        except (RouteError, ValueError, TypeError):
            self.garbled += 1
            log.warning("garbled route announcement from %s: asking for its full set", site)
            in_order = False
        if not in_order:
            self.cluster.send(site, Channel.ROUTES, b'{"resync":true}')

    # ---- messages ---------------------------------------------------------------------------
    def match(self, topic: str) -> tuple[frozenset[str], RemoteShared]:
        return self.remote.match(topic)

    def forward(self, message: Message, sites: frozenset[str], picks: Forwards) -> int:
        """Queues `message` for every node in `sites` (plain routes) or `picks` (shared
        members); returns how many nodes it goes to."""
        if not sites and not picks:
            return 0
        value = encode_message(message)
        plain_entry = encode_entry(PLAIN, [], value) if sites else b""
        for site in sites:
            targets = picks.get(site)
            self._queue(site, encode_entry(PLAIN, targets, value) if targets else plain_entry)
        for site, targets in picks.items():
            if site not in sites:
                self._queue(site, encode_entry(0, targets, value))
        return len(sites | picks.keys())

    def _queue(self, site: str, entry: bytes) -> None:
        self._outbox.setdefault(site, []).append(entry)
        traffic = self._traffic(site)
        traffic.messages_out += 1
        traffic.bytes_out += len(entry)
        self._soon()

    def _traffic(self, site: str) -> PeerTraffic:
        traffic = self.traffic.get(site)
        if traffic is None:
            traffic = self.traffic[site] = PeerTraffic()
        return traffic

    def _soon(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        announcement = self.local.announcement()
        if announcement is not None:
            self.cluster.broadcast(Channel.ROUTES, announcement)
        outbox, self._outbox = self._outbox, {}
        for site, entries in outbox.items():
            self.cluster.send(site, Channel.FORWARD, b"".join(entries))

    def _forward_frame(self, site: str, payload: bytes) -> None:
        try:
            entries = decode_frame(payload)
        except ForwardError as error:
            self.garbled += 1
            log.warning("dropping a forward frame from %s: %s", site, error)
            return
        self._traffic(site).messages_in += len(entries)
        for flags, targets, message in entries:
            if flags & PLAIN or targets:
                self.node.deliver_forwarded(message, bool(flags & PLAIN), targets)

    # ---- observability -------------------------------------------------------------------------
    def metrics(self) -> list[tuple[str, str, str, dict[str, str], float]]:
        names = {site: m.identity.node for site, m in self.cluster.membership.members.items()}
        samples: list[tuple[str, str, str, dict[str, str], float]] = [
            ("mqtt_cluster_routes", "gauge", "Route entries announced by other nodes", {},
             len(self.remote)),
            ("mqtt_cluster_garbled", "counter",
             "Route announcements or forward frames from peers that could not be read", {},
             self.garbled),
        ]
        for site, traffic in sorted(self.traffic.items()):
            peer = {"peer": names.get(site, site)}
            samples += [
                ("mqtt_cluster_forwarded_messages", "counter",
                 "Messages forwarded to a peer", peer, traffic.messages_out),
                ("mqtt_cluster_forwarded_bytes", "counter",
                 "Bytes of messages forwarded to a peer", peer, traffic.bytes_out),
                ("mqtt_cluster_received_messages", "counter",
                 "Messages forwarded by a peer to this node", peer, traffic.messages_in),
            ]
        return samples

    def route_table(self) -> list[dict[str, Any]]:
        return [{"node": site, "topic": route[0], "group": route[1], "clientid": route[2]}
                for site, route in self.remote.routes()]




