"""One broker node: the router, the sessions and the retainer, and how a message moves.

This is the seam between protocol handling (connections) and state; everything that
reaches more than one client goes through `publish`.
"""

import logging
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from broker.alarms import Alarms
from broker.auth.security import Security
from broker.config.loader import Config
from broker.ds import DurableStorage, Settings, space
from broker.format_check import open_formats
from broker.mqtt.constants import ReasonCode
from broker.mqtt.topic import parse_shared
from broker.retainer.store import RetainedStore
from broker.routing.filter_index import FilterIndex
from broker.routing.router import Forwards, Router
from broker.session.durable import records
from broker.session.durable.group_views import GroupViews
from broker.session.durable.groups import GONE, READY, STALLED, GroupManager
from broker.session.durable.persist import MessagePersister
from broker.session.durable.session import DurableContext, DurableSession
from broker.session.durable.store import SessionStore
from broker.session.durable.streams import KIND as STREAM_KIND
from broker.session.durable.streams import Streams, is_stream_key
from broker.session.manager import SessionManager
from broker.session.message import Message, stored_message
from broker.session.session import Delivery, Session, SubscriptionOptions
from broker.stats import Stats

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from broker.cluster.routing import ClusterRouting
    from broker.cluster.takeover import Takeover

_CACHE_LIMIT: Final = 10_000


class PublishLimits:
    """The settings checked on every PUBLISH, read once: a Config lookup per packet shows up
    in profiles. (A plain class, compiled to native attributes: a dataclass costs a start
    ~0.7 ms to build, issue 42.)"""

    __slots__ = ("max_awaiting_rel", "max_inflight", "max_qos", "max_topic_alias",
                 "max_topic_levels", "retain_available")

    def __init__(self, config: Config) -> None:
        self.max_qos: int = config["mqtt.max_qos_allowed"]
        self.retain_available: bool = config["mqtt.retain_available"]
        self.max_topic_levels: int = config["mqtt.max_topic_levels"]
        self.max_topic_alias: int = config["mqtt.max_topic_alias"]
        self.max_inflight: int = config["mqtt.max_inflight"]
        self.max_awaiting_rel: int = config["mqtt.max_awaiting_rel"]


class Node:
    def __init__(self, config: Config) -> None:
        open_formats(config)  # first: refuses formats it cannot read before writing any
        self.config = config
        self.limits = PublishLimits(config)
        self.stats = Stats()
        self.security = Security(config)
        # Raised and cleared by storage (a full disk, the quota); the app publishes changes.
        self.alarms = Alarms(config["node.name"])
        self.router = Router(config["mqtt.shared_subscription_strategy"])
        # Set by the app when the node runs in a cluster (routes and forwarding).
        self.cluster_routing: ClusterRouting | None = None
        # Set with it: client IDs claimed cluster-wide before a CONNECT is acknowledged.
        self.takeover: Takeover | None = None
        self.connections: set[Any] = set()
        self.retainer: RetainedStore | None = None
        if config["durable_sessions.enable"]:  # before any database opens (a full volume)
            space.release_reserve_if_short(Path(config["node.data_dir"]) / "ds")
        # Set by the app: retained messages are written through the metadata Raft group.
        self.retained_writer: Callable[[Message], Awaitable[None]] | None = None
        # Durable Storage: opened here, its timers started and its buffers flushed by BrokerApp;
        # the retained messages' store meanwhile on a thread of its own (each LevelDB's
        # creation waits on fsyncs, which the other's need not wait for).
        self.ds: DurableStorage | None = None
        retained: Future[RetainedStore] | None = None
        with ThreadPoolExecutor(1, thread_name_prefix="retained-open") as opening:
            if config["retainer.enable"]:
                retained = opening.submit(
                    RetainedStore, Path(config["node.data_dir"]) / "retained",
                    config["retainer.max_retained_messages"],
                    config["retainer.max_payload_size"], config["retainer.expiry_interval"])
            if config["durable_sessions.enable"]:
                self.ds = DurableStorage(Path(config["node.data_dir"]),
                                         Settings.from_config(config), stored_message)
        if retained is not None:
            self.retainer = retained.result()
        self.durable: DurableContext | None = None
        self.persister: MessagePersister | None = None
        if self.ds is not None:
            self.ds.space.listeners.append(self.storage_alarm)
            self.persister = MessagePersister(self.ds)
            self.durable = DurableContext(self.ds, SessionStore(self.ds), self.stats,
                                          config["durable_sessions.batch_size"],
                                          config["durable_sessions.session_ttl"])
        # Filters of durable sessions, those out of memory too: a message on a matching topic
        # is stored once in DS.
        self.durable_filters = FilterIndex()
        # Set by the app with replicated Durable Storage: the filters are every node's (from
        # the replicated `sessions` database), a publish is stored by the node that takes it,
        # and durable filters are no routes (no node stores a message a second time).
        self.replicated_ds = False
        self._durable_topics: dict[str, int] = {}
        # Named streams (`$stream/<name>`): durable filters that exist without a session.
        self.streams: Streams | None = None
        if self.durable is not None:
            self.streams = self.durable.streams = Streams(self.durable.ds, self.durable.store,
                                                          self._stream_changed)
        # Members of each durable group (`$share/...` of durable sessions) this node knows.
        self._share_members: dict[str, set[str]] = {}
        self.sessions = SessionManager(
            self.publish, self._forget_subscriptions,
            config["mqtt.max_mqueue_len"], config["mqtt.mqueue_store_qos0"], self.durable,
        )
        # Durable shared-subscription groups (`$share/...` of durable sessions).
        self.groups: GroupManager | None = None
        self.group_views: GroupViews | None = None
        self._is_up: Callable[[str], bool] = lambda site: True
        # Replicated: the committed metas of durable group members `_member_state` read, by
        # client ID, until another one is applied (every member is looked at each tick).
        self._member_metas: dict[str, records.Meta | None] = {}
        if self.durable is not None:
            self.groups = self.durable.groups = GroupManager(
                self.durable.ds, self.durable.store, self.stats, self.sessions.sessions,
                self._member_state, False,
                config["durable_sessions.shared_subscription_ack_timeout"])
            self.groups.stall_changed = self.sessions.stall_changed
            self.group_views = GroupViews(self.groups, self.durable.ds, self.durable.store)

    def replicate_sessions(self, decides: Callable[[], bool], is_up: Callable[[str], bool],
                           read_barrier: Callable[[], Awaitable[bool]],
                           shard_barrier: Callable[[int], Awaitable[bool]],
                           groups_allowed: Callable[[], bool],
                           groups_soon: Callable[[], Awaitable[bool] | None],
                           seen: Callable[[], Awaitable[None]]) -> None:
        """Replicated Durable Storage (builtin_raft): the `sessions` database is every
        node's; durable groups are decided by the node that `decides` (the leader of the
        `sessions` group), a member counting as connected while its node `is_up`, and
        joined only while `groups_allowed` (every member's code fences their writes), or
        once `groups_soon` (GroupManager.allowed_soon). The barriers (GroupManager) make
        sure this node's replicas hold what a group's records name before it reads them. A
        durable SUBACK waits until the nodes this one reaches have `seen` the subscription
        (peer_applied.py)."""
        self.replicated_ds = True
        self._is_up = is_up
        if self.durable is not None and self.groups is not None:
            self.durable.replicated = self.groups.replicated = True
            self.durable.seen_everywhere = seen
            self.durable.store.committed_group_reads = True
            self.groups.decides = decides
            self.groups.read_barrier = read_barrier
            self.groups.shard_barrier = shard_barrier
            self.groups.allowed = groups_allowed
            self.groups.allowed_soon = groups_soon

    def member_node(self, client_id: str) -> str | None:
        """The site of the node serving a durable group member (its replicated meta's, when
        not this node), None when no node holds it."""
        if self.durable is None:
            return None
        if client_id in self.sessions.sessions or client_id in self.sessions.offline:
            return self.durable.store.site
        meta = self.durable.store.meta(client_id) if self.replicated_ds else None
        return meta.site if meta is not None else None

    def _member_state(self, client_id: str) -> str:
        """A durable group member's client: connected here, or (replicated) on a node that
        is up, as its session's committed meta says (read from the replica once, until
        another one is applied: every member of every group is looked at each tick);
        READY or STALLED then, else GONE."""
        session = self.sessions.sessions.get(client_id)
        if isinstance(session, DurableSession) and session.connection is not None:
            return STALLED if session.stalled else READY
        if not self.replicated_ds or self.durable is None:
            return GONE
        metas = self._member_metas
        if client_id in metas:
            meta = metas[client_id]
        else:
            raw = self.durable.ds.sessions.raw_get(records.meta_key(client_id))
            meta = metas[client_id] = None if raw is None else records.Meta.from_bytes(raw)
        if (meta is not None and meta.connected and meta.site != self.durable.store.site
                and self._is_up(meta.site)):
            return STALLED if meta.stalled else READY
        return GONE

    def restore_durable_sessions(self) -> int:
        """Start-up (on the running loop): the durable filter index from the stored
        subscriptions' keys alone, before any client is served; the sessions themselves stay
        on disk until their clients come back (SessionManager.restore). Returns how many
        subscriptions there are."""
        if self.durable is None:
            return 0
        indexed = 0
        if not self.replicated_ds:  # (replicated: `durable_state_applied` did, from the replica)
            for client_id, key in self.durable.store.subscription_keys():
                self.add_durable_filter(client_id, key)
                indexed += 1
            if self.groups is not None:
                self.groups.load()
            if self.streams is not None:
                self.streams.load()
        self.sessions.restore()
        return indexed

    def add_durable_filter(self, client_id: str, key: str) -> None:
        """A durable session's subscription (`key`, a share's too): messages matching its
        filter are stored from now on."""
        entry = self._durable_entry(client_id, key, True)
        if entry is not None:
            self._durable_filter(entry[0], entry[1], True)

    def remove_durable_filter(self, client_id: str, key: str) -> None:
        entry = self._durable_entry(client_id, key, False)
        if entry is not None:
            self._durable_filter(entry[0], entry[1], False)

    def _durable_filter(self, topic_filter: str, entry: str, added: bool) -> None:
        """Adds or removes a durable filter's entry; a durable filter is a route of this
        node too (unless storage is replicated: every node stores for every filter)."""
        listener = None if self.replicated_ds else self.router.listener
        if added:
            changed = self.durable_filters.add(topic_filter, entry)
        else:
            changed = self.durable_filters.remove(topic_filter, entry)
        if changed and listener is not None:
            listener(topic_filter, None, entry, added)
        self._durable_topics.clear()

    def _stream_changed(self, entry: str, old: str | None, new: str | None) -> None:
        """A stream was created, deleted or replaced: its filter stores from now on."""
        if old is not None:
            self._durable_filter(old, entry, False)
        if new is not None:
            self._durable_filter(new, entry, True)

    def _durable_entry(self, client_id: str, key: str, added: bool) -> tuple[str, str] | None:
        """(filter, entry) of a durable subscription in the node's durable filters, when
        it changes them: a durable group is one entry whatever its members (a publish
        matches it in constant time with 10,000 members), there while it has one; a
        stream's subscription none (its stream's filter stores, with or without readers)."""
        if is_stream_key(key):
            return None
        if not key.startswith("$share/"):
            return key, client_id
        members = self._share_members.setdefault(key, set())
        had = bool(members)
        if added:
            members.add(client_id)
        else:
            members.discard(client_id)
            if not members:
                del self._share_members[key]
        if had == bool(members):
            return None
        return parse_shared(key)[1], key

    def durable_state_applied(self, writes: Iterable[tuple[bytes, bytes | None]],
                              replaced: bool) -> None:
        """Replicated storage: writes to the `sessions` database, from any node, applied
        here. Subscriptions of durable sessions become this node's durable filters, so a
        message published here is stored when any node's durable session wants it. Metas
        go to the sessions held here (`SessionManager.meta_applied`)."""
        if replaced:
            self.durable_filters = FilterIndex()
            self._share_members.clear()
            self._member_metas.clear()
            if self.streams is not None:
                self.streams.clear()
        writes = list(writes)
        for key, value in writes:
            kind, client_id = records.split_key(key)
            if kind == STREAM_KIND and self.streams is not None:
                self.streams.applied(key, value)
                continue
            if kind == b"m":
                self._member_metas.pop(client_id, None)
            if kind == b"m" and value is not None and (client_id in self.sessions.sessions
                                                       or client_id in self.sessions.offline):
                self.sessions.meta_applied(client_id, records.Meta.from_bytes(value))
            if kind != b"s":
                continue
            entry = self._durable_entry(
                client_id, key[len(records.prefix(b"s", client_id)):].decode(), value is not None)
            if entry is None:
                continue
            if value is None:
                self.durable_filters.remove(*entry)
            else:
                self.durable_filters.add(*entry)
        self._durable_topics.clear()
        if self.groups is not None:
            if replaced:
                self.groups.load()
            else:
                self.groups.applied(writes)

    def storage_alarm(self, name: str, message: str | None, details: dict[str, Any]) -> None:
        """Durable Storage refuses writes (`message`: why) or takes them again (None)."""
        if message is None:
            self.alarms.deactivate(name)
        else:
            self.alarms.activate(name, message, details)

    def durable_writes_refused(self, client_ids: set[str]) -> None:
        """Replicated storage: the replicas refused this node's writes of these sessions
        (another node claimed one, or it ended while this node was cut off): a session still
        served here would acknowledge what no replica records, so it goes."""
        for client_id in client_ids:
            self.sessions.claimed_elsewhere(client_id)

    def load_durable_session(self, client_id: str) -> bool:
        """Replicated storage: a durable session stored by another node comes here with its
        client (SessionManager.load)."""
        session = self.sessions.load(client_id)
        if session is None:
            return False
        for key in session.subscriptions:
            self.add_durable_filter(client_id, key)
        return True

    def _durable_matches(self, topic: str) -> int:
        count = self._durable_topics.get(topic)
        if count is None:
            count = self.durable_filters.matches(topic)
            if len(self._durable_topics) >= _CACHE_LIMIT:
                self._durable_topics.clear()
            self._durable_topics[topic] = count
        return count

    def publish(self, message: Message) -> tuple[int, Awaitable[None] | None]:
        """Stores if retained, stores once in DS if a durable session subscribed to the topic,
        then hands the message to every matching regular session. Returns how many sessions
        it reached and, when it was stored (retained, or in DS), what resolves once that is
        durable (committed, for a retained message)."""
        cluster = self.cluster_routing
        retained: Awaitable[None] | None = None
        if message.retain and self.retainer is not None:
            retained = self._retain(message)
        durable = self._durable_matches(message.topic) if self.ds is not None else 0
        stored = self._persist(message) if durable else None
        if retained is not None:
            stored = retained if stored is None else _both(stored, retained)
        remote = 0
        if cluster is None:
            deliveries = self.router.route(message, self._is_online)
        else:
            sites, shared = cluster.match(message.topic)
            picks: Forwards = {}
            deliveries = self.router.route(message, self._is_online, True, shared or None,
                                           picks)
            remote = cluster.forward(message, sites, picks)
        self._deliver(deliveries)
        if not deliveries and not durable and not remote:
            self.stats.drop("no_subscribers")
        return len(deliveries) + durable + remote, stored

    def adopt_session(self, client_id: str, expiry: int,
                      subscriptions: dict[str, SubscriptionOptions]) -> Session:
        """A session moving here from another node (a takeover): routed to from now on,
        disconnected until its CONNECT is acknowledged; deliveries meanwhile wait in its
        queue. Replaces a session of the ID this node kept (the moved one is newer)."""
        old = self.sessions.get(client_id)
        if old is not None and old.connection is not None:
            old.connection.take_over(ReasonCode.SESSION_TAKEN_OVER)
            old = self.sessions.sessions.get(client_id)
        if old is not None:
            self.sessions.end(old)
        session = Session(client_id, expiry, self.config["mqtt.max_mqueue_len"],
                          self.config["mqtt.mqueue_store_qos0"])
        self.sessions.sessions[client_id] = session
        for key, options in subscriptions.items():
            session.subscriptions[key] = options
            self.router.subscribe(client_id, parse_shared(key)[1], options)
        return session

    def _persist(self, message: Message) -> Awaitable[None]:
        """Stores the message once in DS for the durable sessions that match it."""
        assert self.persister is not None
        self.stats.durable_persisted += 1
        stored = self.persister.add(message)
        self.stats.durable_writes.watch(stored)
        return stored

    def _retain(self, message: Message) -> Awaitable[None] | None:
        """Sets (empty payload: clears) the topic's retained message: through the metadata
        Raft group when the app runs one (what it returns resolves once committed), else in
        the local store at once."""
        retainer = self.retainer
        assert retainer is not None
        admitted = retainer.admit(message)
        writer = self.retained_writer
        if admitted is None or (writer is None and not retainer.put(admitted)):
            self.stats.drop("retained_limit")
            return None
        return writer(admitted) if writer is not None else None

    def deliver_forwarded(self, message: Message, plain: bool,
                          targets: list[tuple[str, str, str]]) -> None:
        """A message published on another node: to this node's durable store and plain
        subscribers (if it matched this node's plain routes there) and to the shared-group
        members it picked here; never forwarded again."""
        if plain and self.ds is not None and self._durable_matches(message.topic):
            self._persist(message)
        deliveries = self.router.route(message, self._is_online, False) if plain else {}
        for group, topic_filter, client_id in targets:
            deliveries.update(self.router.route_shared(message, group, topic_filter, client_id,
                                                       self._is_online))
        self._deliver(deliveries)

    def _deliver(self, deliveries: dict[str, Delivery]) -> None:
        sessions = self.sessions.sessions
        for client_id, delivery in deliveries.items():
            session = sessions[client_id]
            connection = session.connection
            if connection is not None:
                connection.deliver(delivery)
            else:
                lost = session.enqueue(delivery)
                if lost:
                    self.stats.drop(lost)

    def _is_online(self, client_id: str) -> bool:
        session = self.sessions.sessions.get(client_id)
        return session is not None and session.connection is not None

    def store_routed_shares(self) -> None:
        """The cluster now allows durable groups (versions.DURABLE_GROUPS): the shared
        subscriptions durable sessions made before, routed live meanwhile (a rolling upgrade
        from 0.1.0; a fresh cluster's first moments only when the wait for the rise timed
        out: handlers/subscribe.py), join their groups; stored first, then unrouted, so a
        message published here in between may come twice, while one in flight from another
        node to a member whose route went meanwhile is missed (docs/cluster.md)."""
        moved = 0
        for session in list(self.sessions.sessions.values()):
            if not isinstance(session, DurableSession):
                continue
            for key in session.take_routed():
                options = session.subscriptions[key]
                if session.subscribe(key, options):
                    self.add_durable_filter(session.client_id, key)
                self.router.unsubscribe(session.client_id, parse_shared(key)[1],
                                        options.share_group)
                moved += 1
        if moved:
            log.info("%d shared subscriptions of durable sessions, routed live until the "
                     "cluster allowed durable groups, joined their groups", moved)

    def _forget_subscriptions(self, session: Session) -> None:
        dropped = session.queued
        if dropped:
            self.stats.drop("session_ended", dropped)
        for key, options in session.subscriptions.items():
            _, topic_filter = parse_shared(key)
            if session.is_routed(key):
                self.router.unsubscribe(session.client_id, topic_filter, options.share_group)
            else:
                self.remove_durable_filter(session.client_id, key)
        session.subscriptions.clear()

    @property
    def joined(self) -> bool:
        """Whether the node has tried to join every peer discovery named (a single node, or
        `manual` discovery, at once): readiness, on Kubernetes."""
        cluster = self.cluster_routing.cluster if self.cluster_routing is not None else None
        return cluster is None or cluster.joined

    def gauges(self) -> dict[str, tuple[str, float]]:
        sessions = self.sessions.sessions.values()
        durable = [s for s in sessions if isinstance(s, DurableSession)]
        return {
            "mqtt_connections": ("Connected clients", len(self.connections)),
            "mqtt_sessions": ("Sessions, connected or not",
                              len(self.sessions.sessions) + len(self.sessions.offline)),
            "mqtt_subscriptions": ("Subscriptions", len(self.router)),
            "mqtt_durable_filters": (
                "Durable sessions' subscriptions and streams whose messages this node stores"
                " (every node's, with replicated Durable Storage)", len(self.durable_filters)),
            "mqtt_retained_messages": (
                "Retained messages stored", len(self.retainer) if self.retainer else 0
            ),
            "mqtt_inflight": ("Deliveries awaiting acknowledgement",
                              sum(len(s.inflight) for s in sessions)),
            "mqtt_queued": ("Messages queued in sessions", sum(s.queued for s in sessions)),
            "mqtt_durable_sessions_connected": (
                "Durable sessions with a connection",
                sum(1 for s in durable if s.connection is not None),
            ),
            "mqtt_durable_sessions_disconnected": (
                "Durable sessions kept for a client that is away",
                sum(1 for s in durable if s.connection is None) + len(self.sessions.offline),
            ),
            "mqtt_durable_sessions_offloaded": (
                "Durable sessions kept for a client that is away, out of memory until it is"
                " back (or their will or expiry is due)", len(self.sessions.offline)),
            "mqtt_durable_state_writes_pending": (
                "Durable session changes (acknowledgements, subscriptions) not yet on disk",
                self.durable.store.unsettled if self.durable is not None else 0,
            ),
            "mqtt_cluster_joined": (
                "1 once this node has tried to join every peer discovery named (what"
                " /api/v5/ready answers; a pod is Ready only then), 0 before",
                int(self.joined)),
            "mqtt_durable_checkpoint_lag": (
                "Deliveries recorded but not yet acknowledged, durable sessions in memory",
                sum(s.backlog() for s in durable),
            ),
        }

    def close(self) -> None:
        self.sessions.close_all()
        if self.retainer is not None:
            self.retainer.close()


async def _both(first: Awaitable[None], second: Awaitable[None]) -> None:
    """A PUBLISH stored twice (retained, and in DS) is durable once both are."""
    await first
    await second
