"""Starts and stops a node: listeners, HTTP API, periodic jobs, signal handling.

A stop closes the listeners first (no new clients), then the connections, then flushes and
closes storage, so SIGTERM under load loses nothing that was acknowledged.
"""

import asyncio
import contextlib
import gc
import logging
import signal
import ssl
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker import COMPILED_MODULES
from broker.alarms import DISK_FULL, Alarm
from broker.cluster import placement, versions
from broker.cluster.metadata import MetadataGroup
from broker.cluster.routing import ClusterRouting
from broker.cluster.rpc import Rpc
from broker.cluster.service import Cluster
from broker.cluster.takeover import Takeover
from broker.cluster.version_keeper import VersionKeeper
from broker.config.loader import Config
from broker.config.values import split_node_name
from broker.ds.space import out_of_space
from broker.format_check import record_cluster_version
from broker.mqtt.constants import ReasonCode
from broker.node import Node
from broker.periodic import every
from broker.server.admission import ListenerGate
from broker.server.http_listener import HttpListener
from broker.server.output import OutputBatch
from broker.server.ratelimit import ClientRates
from broker.server.reactor import create_server
from broker.server.tls import CertificateWatch, tls_context
from broker.server.transports import MQTTStreamProtocol, WebSocketOptions, websocket_protocols
from broker.session.durable import ownership
from broker.session.durable.session import DurableSession
from broker.sys_topics import SysTopics, alarm_message, remove_client_written
from broker.version import RELEASE

if TYPE_CHECKING:  # imported where configured: a node with local storage does without
    from broker.cluster.ds_groups import DsGroups

log = logging.getLogger(__name__)


class BrokerApp:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.node = Node(config)
        self.cluster = Cluster(config)
        self.rpc = Rpc(self.cluster)
        self.node.cluster_routing = ClusterRouting(self.node, self.cluster)
        self.node.takeover = Takeover(self.node, self.cluster, self.rpc, self._mqtt_address,
                                      min(5.0, config["node.dist_net_ticktime"]))
        # The metadata Raft group: today it holds the retained messages, so no store, no group.
        self.metadata: MetadataGroup | None = None
        if self.node.retainer is not None:
            # Leadership goes only to a peer whose Raft decodes TimeoutNow (not 0.1.0's).
            self.metadata = MetadataGroup(
                config, self.cluster, self.rpc, self.node.retainer,
                partial(self.node.stats.drop, "retained_limit"),
                can_transfer_to=partial(self.cluster.supports,
                                        cluster_version=versions.TIMEOUT_NOW))
            self.node.retained_writer = self.metadata.write_retained
            self.metadata.on_disk = self._raft_log_space
            if self.node.ds is not None:
                self.metadata.room = self.node.ds.space.has_room
        # The cluster's effective version, kept in the metadata group.
        self.versions: VersionKeeper | None = None
        if self.metadata is not None:
            self.versions = VersionKeeper(self.metadata, self.cluster, partial(
                record_cluster_version, Path(config["node.data_dir"])))
        # Replicated Durable Storage: its Raft groups live next to the metadata group.
        self.ds_groups: DsGroups | None = None
        if config["durable_storage.messages.backend"] == "builtin_raft" and self.node.ds:
            if self.metadata is None:
                raise ValueError("durable_storage.messages.backend = builtin_raft needs"
                                 " retainer.enable = true (the metadata Raft group)")
            self.ds_groups = self._replicate(self.metadata)
        self._servers: list[asyncio.Server] = []
        self._http: HttpListener | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._placement_seen: tuple[int, ...] | None = None
        self._tls: CertificateWatch | None = None
        self.ports: dict[str, int] = {}

    def _replicate(self, metadata: MetadataGroup) -> "DsGroups":
        """Durable Storage's Raft groups, and the node's durable sessions through them. Their
        modules are imported here: a node with local storage starts without them."""
        from broker.cluster.ds_groups import DsGroups
        from broker.cluster.peer_applied import PeersApplied

        config, node, keeper = self.config, self.node, self.versions
        assert node.ds is not None and node.takeover is not None and keeper is not None
        # Sealed generations go as files once every node reads such snapshots.
        groups = DsGroups(config, node.ds, metadata, node.durable_state_applied,
                          ownership.admitted, node.durable_writes_refused, ownership.sessions_of,
                          partial(keeper.allows, versions.FILE_SNAPSHOTS))
        node.replicate_sessions(partial(groups.leads, None), groups.is_up,
                                groups.sessions_barrier, groups.shard_barrier,
                                partial(keeper.allows, versions.DURABLE_GROUPS),
                                partial(keeper.until, versions.DURABLE_GROUPS),
                                partial(groups.sessions_seen, PeersApplied(
                                    self.rpc, metadata,
                                    config["durable_storage.raft.election_timeout"])))
        node.takeover.replicated = groups
        keeper.on_rise = self._versions_rose
        return groups

    def _versions_rose(self, version: int) -> None:
        if version >= versions.DURABLE_GROUPS:
            self.node.store_routed_shares()

    def _raft_log_space(self, error: BaseException | None) -> None:
        """The Raft log or a state machine has no space (`error`), or has again (None):
        durable writes are refused meanwhile, under the disk_full alarm (Durable Storage
        clears it once its volume has room and Raft writes and applies again)."""
        node = self.node
        if error is not None and not out_of_space(error):
            return  # logged by the Raft node; not the disk_full alarm's business
        if node.ds is not None:
            node.ds.space.hold("raft_log", error)
        elif error is None:
            node.alarms.deactivate(DISK_FULL)
        else:
            node.alarms.activate(DISK_FULL, f"no space for the Raft log ({error})",
                                 {"path": self.config["durable_storage.raft.wal_dir"]
                                  or str(Path(self.config["node.data_dir"]) / "raft")})

    def _mqtt_address(self) -> str:
        """Where a client reaches this node (Server Reference): its node name's host and its
        MQTT port."""
        host, _ = split_node_name(self.config["node.name"])
        return f"{host}:{self.ports.get('tcp', 1883)}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config, node = self.config, self.node
        if self.ds_groups is None:
            indexed = node.restore_durable_sessions()
            if indexed:
                log.info("indexed %d subscriptions of stored durable sessions", indexed)
        elif node.ds is not None:
            # Every node's durable filters, as this replica holds them; the log's entries
            # after it come through `durable_state_applied`.
            node.durable_state_applied(node.ds.sessions.raw_items(), True)
        output = OutputBatch(loop)
        listeners: list[tuple[str, Any, Callable[[], asyncio.Protocol], ssl.SSLContext | None]] = [
            ("tcp", config["listeners.tcp.default.bind"],
             partial(MQTTStreamProtocol, node, output, _gate(config, "tcp"),
                     ClientRates.from_config(config, "tcp")), None),
            ("ws", config["listeners.ws.default.bind"],
             websocket_protocols(node, output, WebSocketOptions.from_config(config),
                                 _gate(config, "ws"), ClientRates.from_config(config, "ws")),
             None),
        ]
        tls = tls_context(config)
        if tls is not None:
            self._tls = CertificateWatch(tls, config)
            listeners.append(("ssl", config["listeners.ssl.default.bind"],
                              partial(MQTTStreamProtocol, node, output, _gate(config, "ssl"),
                                      ClientRates.from_config(config, "ssl")),
                              tls))
        for name, bind, factory, ssl_context in listeners:
            if bind is None:
                continue
            server = await create_server(
                loop, factory, bind[0], bind[1], ssl=ssl_context, reuse_address=True,
                backlog=4096)
            self._servers.append(server)
            self.ports[name] = server.sockets[0].getsockname()[1]
            log.info("listener %s on %s:%d", name, bind[0], self.ports[name])
        http_bind = config["dashboard.listeners.http.bind"]
        if http_bind is not None:
            self._http = HttpListener()
            self.ports["http"] = await self._http.bind(http_bind[0], http_bind[1])
        # A replica of replicated Durable Storage catches up as soon as its links are up:
        # the HTTP API's import is over by then (see HttpListener.start_import).
        importing = (self._http.start_import()
                     if self._http is not None and self.ds_groups is not None else None)
        if self.metadata is not None:
            await self.metadata.start()  # before the links: Raft frames find it ready
        if importing is not None:
            await importing
        await self.cluster.start()
        if self.versions is not None:
            self._every(VERSION_ROUND, self.versions.round)
        balance: float = config["durable_storage.raft.leader_balance_interval"]
        if self.metadata is not None and balance > 0:
            self._every(balance, self.metadata.balance_leaders)
        if self.ds_groups is not None:
            self._tasks.append(asyncio.create_task(self._restore_replicated()))
            watch = partial(self._watch_placement, self.ds_groups,
                            Path(config["durable_storage.messages.placement_file"]),
                            config["durable_storage.messages.n_shards"])
            self._every(PLACEMENT_POLL, watch, at_once=True)
        node.security.start()
        if self._tls is not None:
            self._every(CERTIFICATE_POLL, self._tls.check)
        if node.ds is not None:
            node.ds.start(spares=self.ds_groups is None)  # (else `_restore_replicated`)
        if node.durable is not None:
            store = node.durable.store
            self._every(config["durable_sessions.heartbeat_interval"],
                        lambda: store.heartbeat(time.time()), at_once=True)
            self._every(config["durable_sessions.session_gc_interval"], self._collect_sessions)
        if node.groups is not None:
            # Stalled members; with builtin_raft, decided on the `sessions` leader from its
            # replica: again every second, for a member's node that went down and a leader
            # that changed.
            self._every(GROUP_TICK, node.groups.tick)
        if node.group_views is not None:
            self._every(GROUP_VIEWS_INTERVAL, node.group_views.refresh, at_once=True)
        if node.retainer is not None:
            self._every(config["retainer.msg_clear_interval"], self._clear_retained)
            if not config["sys_topics.allow_client_publish"]:
                removed = remove_client_written(node.retainer)
                if removed:
                    log.info("removed %d retained $SYS messages published by clients", removed)
        node.alarms.on_change = partial(_alarm_changed, node)
        sys_topics = SysTopics(config["node.name"], RELEASE, node.publish, node.gauges,
                               node.stats)
        # As in EMQX, the first round comes one interval after start, and rounds count in
        # the node's metrics like any message (no_subscribers drops, 3 retained messages).
        self._every(config["sys_topics.sys_msg_interval"], sys_topics.publish)
        if self._http is not None:  # last: MQTT clients are served meanwhile (http_listener.py)
            await self._http.serve(self)
            log.info("HTTP API on %s:%d", http_bind[0], self.ports["http"])

    def _watch_placement(self, groups: "DsGroups", path: Path, n_shards: int) -> None:
        """A stat per poll; the file is read again when it changed (kubelet swaps a
        ConfigMap's files by a symlink, which changes the inode)."""
        try:
            stat = path.stat()
            seen: tuple[int, ...] | None = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        except OSError:
            seen = None
        if seen == self._placement_seen:
            return
        self._placement_seen = seen
        try:
            groups.placement = placement.read(path, n_shards)
        except placement.PlacementError as error:
            log.error("placement file %s not followed: %s", path, error)
            return
        if groups.placement is not None:
            log.info("following placement revision %d from %s", groups.placement.revision,
                     path)

    async def _restore_replicated(self) -> None:
        """Replicated storage: this node's durable sessions come back once its replica of
        replicas hold everything committed (one of them may have moved meanwhile), and its
        shards' next generations are made ahead from then on."""
        assert self.ds_groups is not None
        while not await self.ds_groups.sync():
            pass
        if self.node.ds is not None:
            self.node.ds.messages.make_spares()
        self.node.restore_durable_sessions()

    def _every(self, interval: float, job: Callable[[], object], *, at_once: bool = False) -> None:
        """A node timer, cancelled at stop; an interval of 0 turns it off."""
        if interval > 0:
            self._tasks.append(asyncio.create_task(every(interval, job, at_once=at_once)))

    def reload(self, reason: str) -> None:
        """SIGHUP: the password and ACL files and the TLS certificate, read again."""
        self.node.security.reload(reason)
        if self._tls is not None:
            self._tls.reload()

    def _clear_retained(self) -> None:
        assert self.node.retainer is not None
        removed = self.node.retainer.clear_expired()
        if removed:
            log.info("removed %d expired retained messages", removed)

    async def _collect_sessions(self) -> None:
        ended = self.node.sessions.collect_garbage()
        if self.ds_groups is not None and self.ds_groups.leads(None):
            ended += await self.node.sessions.collect_orphans(self.ds_groups.is_up)
            swept = await self.node.sessions.sweep_tombstones(
                self.config["durable_sessions.tombstone_ttl"])
            if swept:
                log.info("forgot %d ended durable sessions' epochs", swept)
        if ended:
            log.info("garbage collected %d expired durable sessions", ended)

    async def _hand_over(self) -> None:
        """A graceful stop (`node.graceful_stop_timeout`): the Raft groups this node leads
        get other leaders while its clients are still served, so neither they nor the other
        nodes' clients wait an election timeout for the groups to notice it is gone. (A
        single node leads groups it has nobody to hand to: it goes on at once.)"""
        timeout: float = self.config["node.graceful_stop_timeout"]
        if self.metadata is None or timeout <= 0:
            return
        started = time.monotonic()
        handed, kept = await self.metadata.hand_over(timeout)
        if handed or (kept and self.cluster.links):
            log.info("handed the leadership of %d Raft groups to other nodes in %.2f s%s",
                     len(handed), time.monotonic() - started,
                     f"; still leading {len(kept)}" if kept else "")

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        await self._hand_over()
        if self.ds_groups is None:
            await self.cluster.stop()
        await self.node.security.stop()
        for task in self._tasks:
            task.cancel()
        for connection in list(self.node.connections):
            # MQTT 5 clients learn why (0x8B), and reconnect where they connected: Service or
            # load balancer, which sends them to a node that stays. (A Server Reference to a
            # peer would name a node's own address, which may be neither reachable from the
            # client nor the next to stop in a rolling restart.)
            connection.disconnect(ReasonCode.SERVER_SHUTTING_DOWN)
            connection.connection_lost()  # detach its session now, not on a later loop turn
        for server in self._servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)
        if self._http is not None:
            await self._http.close()
        if self.node.groups is not None:
            self.node.groups.close()
        if self.node.durable is not None:
            for session in self.node.sessions.sessions.values():
                if isinstance(session, DurableSession):
                    session.stop_reading()
            with contextlib.suppress(TimeoutError):
                # (Replicated: what cannot be committed now is given up after a while.)
                async with asyncio.timeout(None if self.ds_groups is None else 5):
                    await self.node.durable.store.settle()
        if self.ds_groups is not None:
            self.ds_groups.stop()
            await self.cluster.stop()
        if self.node.ds is not None:
            await self.node.ds.close()  # flushes what is buffered
        if self.versions is not None:
            await self.versions.stop()
        if self.metadata is not None:
            await self.metadata.stop()
        self.node.close()


def _alarm_changed(node: Node, alarm: Alarm) -> None:
    """An alarm raised or cleared: logged, and published to `$SYS` as EMQX does."""
    if alarm.activated:
        log.error("alarm %s raised: %s", alarm.name, alarm.message)
    else:
        log.warning("alarm %s cleared", alarm.name)
    node.publish(alarm_message(node.alarms.node, alarm))


def _gate(config: Config, listener: str) -> ListenerGate:
    prefix = f"listeners.{listener}.default."
    return ListenerGate(listener, config[prefix + "max_connections"],
                        config[prefix + "max_conn_rate"])


# Young-generation collections every 50,000 net allocations, not 700: the message path
# allocates short-lived objects in bursts, freed by reference counting, and each collection
# walked all of them for nothing (~5% of the CPU per durable message, bench/pathcost.py).
_GC_THRESHOLDS = (50_000, 20, 20)
GROUP_TICK = 1.0  # seconds
VERSION_ROUND = 0.5  # seconds: how soon a cluster whose members all run newer code rises
GROUP_VIEWS_INTERVAL = 5.0  # seconds: how old the durable group metrics may be
PLACEMENT_POLL = 2.0  # seconds: kubelet itself refreshes a ConfigMap volume within ~1 min
CERTIFICATE_POLL = 1.0  # seconds: two stats, as the password and ACL files' watch


def _tune_collector() -> None:
    """What start-up built (configuration, restored sessions, storage state) lives as long
    as the process: frozen, so full collections no longer walk it. `broker run` started
    with the collector off (cli.py): it is on from here."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)
    gc.enable()


def run(config: Config) -> None:
    """`serve` on the event loop `node.event_loop` names."""
    factory = None
    if config["node.event_loop"] == "uvloop":
        import uvloop  # only then: its import is not free, and few nodes ask for it

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(config))


async def serve(config: Config) -> None:
    """Runs until SIGTERM or SIGINT, then stops gracefully."""
    app = BrokerApp(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, app.reload, "SIGHUP")
    await app.start()
    _tune_collector()
    log.info("broker %s started (%s)", config["node.name"],
             f"{COMPILED_MODULES} modules compiled" if COMPILED_MODULES else "pure Python")
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await app.stop()
