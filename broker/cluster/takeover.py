"""One owner per client ID across the cluster (EMQX's takeover, over this node's RPC).

A CONNECT is acknowledged only after every linked peer has given the ID up:

    B -> every peer      client.take {id, stamp, session}   the peer ends its connection of
                                                             the ID (0x8E) and, if B wants
                                                             the session, answers with its
                                                             subscriptions
    B installs them:      from now on the ID's messages are routed to B as well
    B -> that peer       client.take_backlog {id}            it answers with the in-flight
                                                             window, the queue and the QoS 2
                                                             IDs awaiting PUBREL, and forgets
                                                             the session
    B merges: the old node's backlog first, then what reached B directly, each PUBLISH once

Two CONNECTs of one ID on two nodes at once are ordered by their stamps, a hybrid logical
clock (wall time, raised past every stamp seen, then site): a node whose own claim is older
gives way; otherwise it answers `newer` and the caller refuses its CONNECT (0x89). Both ends
compare the same two stamps, so exactly one connection is left. A connection already
acknowledged always gives way: the newest CONNECT wins, as on one node.

A partition lets each side accept the ID. When the link comes back, each node sends the
stamps of its connected clients to the other, and the older of two connections of one ID is
ended (0x8E): the registry converges on the newest connection, without a quorum, so a node
cut off from the others keeps serving its own clients.

Durable sessions with node-local Durable Storage (`builtin_local`) stay on the node that
holds their messages: a CONNECT elsewhere that wants one back is refused with 0x9C and that
node's address (Server Reference) for MQTT 5, 3 (server unavailable) for 3.1.1. With
replicated storage (`builtin_raft`) every node has a replica, so the session follows its
client: the node that holds it ends the connection, writes its state through the log and
forgets it (`released`); the claiming node waits for a barrier through every group, claims
the session (ownership.py: from then on the replicas refuse the old holder's writes), waits
for the shards again, then loads the session from its replicas. A node that does not answer
(dead, or cut off) is passed over the same way: the claim fences it off.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster.rpc import Rpc, RpcError
from broker.cluster.service import Cluster
from broker.cluster.session_transfer import (
    TransferError,
    export_backlog,
    export_subscriptions,
    import_backlog,
    import_subscriptions,
)
from broker.mqtt.constants import ReasonCode
from broker.session.durable.session import DurableContext
from broker.session.manager import SessionManager
from broker.session.session import Session, SubscriptionOptions

if TYPE_CHECKING:
    from broker.cluster.ds_groups import DsGroups

log = logging.getLogger(__name__)

Stamp = tuple[int, str]
NO_STAMP: Stamp = (0, "")


class Claim:
    __slots__ = ("stamp", "superseded")

    def __init__(self, stamp: Stamp) -> None:
        self.stamp = stamp
        self.superseded = False


class Outcome:
    """What a claim round decided for one CONNECT."""

    __slots__ = ("reference", "refuse", "session", "stamp")

    def __init__(self, stamp: Stamp) -> None:
        self.stamp = stamp
        self.session: Session | None = None  # moved here from the node that held it
        self.refuse: ReasonCode | None = None
        self.reference = ""  # with USE_ANOTHER_SERVER: where the client's durable session is


class TakeoverStats:
    """Counters for /metrics. (Claim, Outcome and this are plain classes: a dataclass costs a start
    ~0.7 ms to build, issue 42.)"""

    __slots__ = ("converged", "lost_race", "moved_in", "moved_out", "redirected", "resumed",
                 "taken_over", "unanswered")

    def __init__(self) -> None:
        self.moved_in = 0  # sessions taken from another node
        self.moved_out = 0
        self.taken_over = 0  # local connections ended for a CONNECT on another node
        self.lost_race = 0  # CONNECTs refused because a newer one of the ID ran elsewhere
        self.redirected = 0  # refused with Server Reference: a durable session lives elsewhere
        self.resumed = 0  # durable sessions loaded from the replicated storage
        self.unanswered = 0  # peers that did not answer a claim in time
        self.converged = 0  # duplicate connections ended after a partition healed


class SessionHost(Protocol):
    """What a takeover needs of its node (broker/node.py's Node is one): its sessions, and
    the two ways a session comes in from another node."""

    sessions: SessionManager
    durable: DurableContext | None

    def load_durable_session(self, client_id: str) -> bool: ...

    def adopt_session(self, client_id: str, expiry: int,
                      subscriptions: dict[str, SubscriptionOptions]) -> Session: ...


class Takeover:
    def __init__(self, node: SessionHost, cluster: Cluster, rpc: Rpc,
                 reference: Callable[[], str], timeout: float) -> None:
        self._node = node
        self._cluster = cluster
        self._rpc = rpc
        self._reference = reference
        self._timeout = timeout
        self._claims: dict[str, Claim] = {}
        self._clock = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = TakeoverStats()
        # Replicated Durable Storage (set by the app): durable sessions move between nodes.
        self.replicated: DsGroups | None = None
        rpc.register("client.take", self._take)
        rpc.register("client.take_backlog", self._take_backlog)
        rpc.register("client.connected", self._converge)
        cluster.on_peer_up(self._peer_up)

    def stamp(self) -> Stamp:
        self._clock = max(time.time_ns(), self._clock + 1)
        return self._clock, self._cluster.me.site

    def local_stamp(self) -> Stamp | None:
        """The stamp of a CONNECT that needs no claim round; None when it needs one: another
        node could hold the ID, or, with replicated storage, its durable session may be in
        the replicas (with any node's claim on it: even a session in this node's memory
        waits for this node's replica to catch up). One call on every CONNECT's path (this
        module is interpreted), not a check and a stamp."""
        if self._cluster.links or self.replicated is not None:
            return None
        return self.stamp()

    def _observe(self, clock: Any) -> None:
        if isinstance(clock, int) and clock > self._clock:
            self._clock = clock

    # ---- the claiming node -----------------------------------------------------------------
    async def claim(self, client_id: str, want_session: bool) -> Outcome:
        stamp = self.stamp()
        claim = self._claims[client_id] = Claim(stamp)
        try:
            return await self._claim(client_id, want_session, claim)
        finally:
            if self._claims.get(client_id) is claim:
                del self._claims[client_id]

    async def _claim(self, client_id: str, want_session: bool, claim: Claim) -> Outcome:
        outcome = Outcome(claim.stamp)
        params = {"id": client_id, "stamp": list(claim.stamp), "session": want_session}
        answers = await self._rpc.multicall("client.take", params, self._timeout)
        holder, subscriptions = "", None
        for site, answer in answers.items():
            if not isinstance(answer, dict):
                self.stats.unanswered += 1
                log.warning("takeover of %s: node %s did not answer (%s); going on without it",
                            client_id, site, answer)
                continue
            self._observe(answer.get("clock"))
            if answer.get("newer"):
                claim.superseded = True
            elif answer.get("durable"):
                outcome.reference = str(answer["durable"])
            elif "subs" in answer:
                holder, subscriptions = site, answer
        if claim.superseded:
            self.stats.lost_race += 1
            outcome.refuse = ReasonCode.SERVER_BUSY
            return outcome
        if outcome.reference and want_session:
            self.stats.redirected += 1
            outcome.refuse = ReasonCode.USE_ANOTHER_SERVER
            return outcome
        if subscriptions is not None:
            outcome.session = await self._move_in(client_id, holder, subscriptions)
        elif self.replicated is not None and not await self._resume(client_id, want_session):
            outcome.refuse = ReasonCode.SERVER_UNAVAILABLE
            return outcome
        if claim.superseded:  # a newer CONNECT of the ID came while we moved it
            self.stats.lost_race += 1
            outcome.refuse = ReasonCode.SERVER_BUSY
        return outcome

    async def _resume(self, client_id: str, want_session: bool) -> bool:
        """Replicated storage: once this node's replicas caught up, the ID's durable session
        is here, claimed from the node that stored it if need be (also for a Clean Start,
        which then ends it: this node must own it to delete it). When this node cannot catch
        up (cut off from a majority) or another node claimed the session first, a client
        that wants its session is refused (False): it had better go to another node than
        get a state this node may have missed changes of; a Clean Start goes on when this
        node cannot catch up, unless this replica holds a session of the ID that another
        node owns: its new session would be refused (ownership.py), so is the CONNECT."""
        assert self.replicated is not None
        sessions = self._node.sessions
        if not await self.replicated.sync():
            return not want_session and (sessions.get(client_id) is not None
                                         or not self._stored_elsewhere(client_id))
        if sessions.get(client_id) is not None:
            return True
        claimed = await sessions.claim(client_id)
        if claimed is None:
            return True
        # After the claim (applied here, so `sessions` is current): what the previous
        # owner wrote last names messages the shards had committed before, which this
        # node's replicas must hold before it reads.
        if not claimed or not await self.replicated.sync(sessions=False):
            return False
        if sessions.get(client_id) is not None:
            return True
        if not self._node.load_durable_session(client_id):
            return False  # another node claimed it meanwhile (a CONNECT its client gave up)
        self.stats.resumed += 1
        return True

    def _stored_elsewhere(self, client_id: str) -> bool:
        durable = self._node.durable
        if durable is None:
            return False
        meta = durable.store.meta(client_id)
        return meta is not None and meta.site != durable.store.site

    async def _move_in(self, client_id: str, holder: str, subscriptions: Any) -> Session | None:
        try:
            expiry, subs = import_subscriptions(subscriptions)
        except TransferError as error:
            log.warning("takeover of %s from %s: %s; starting a new session", client_id,
                        holder, error)
            return None
        session = self._node.adopt_session(client_id, expiry, subs)
        try:
            backlog = await self._rpc.call(holder, "client.take_backlog", {"id": client_id},
                                           self._timeout)
            import_backlog(session, backlog)
        except (RpcError, TransferError) as error:
            log.warning("takeover of %s from %s: backlog not moved (%s); the session keeps"
                        " its subscriptions and what reached this node", client_id,
                        holder, error)
        self.stats.moved_in += 1
        return session

    # ---- the node that holds the ID --------------------------------------------------------
    async def _take(self, params: Any) -> dict[str, Any]:
        client_id = str(params["id"])
        stamp: Stamp = (int(params["stamp"][0]), str(params["stamp"][1]))
        want_session = bool(params["session"])
        self._observe(stamp[0])
        reply: dict[str, Any] = {"clock": self._clock}
        claim = self._claims.get(client_id)
        if claim is not None:
            if claim.stamp > stamp:
                reply["newer"] = True
                return reply
            claim.superseded = True
        sessions = self._node.sessions
        session = sessions.peek(client_id)
        if session is None:
            return reply
        if session.durable and want_session and self.replicated is None:
            reply["durable"] = self._reference()  # it stays, in memory or out of it
            return reply
        session = sessions.get(client_id)  # loaded, if it was out of memory
        if session is None:
            return reply
        if session.durable and want_session:
            await self._release(session)
            reply["released"] = True
            return reply
        if session.connection is not None:
            self.stats.taken_over += 1
            session.connection.take_over(ReasonCode.SESSION_TAKEN_OVER)
            session = sessions.sessions.get(client_id)  # expiry 0: it ended with its connection
            if session is None:
                return reply
        if not want_session:
            sessions.end(session)  # Clean Start on the other node: it ends here, will and all
            return reply
        reply.update(export_subscriptions(session))
        return reply

    async def _release(self, session: Session) -> None:
        """Replicated storage: the durable session leaves for the claiming node, once its
        state is committed (that node reads it from its replica)."""
        if session.connection is not None:
            self.stats.taken_over += 1
            session.connection.take_over(ReasonCode.SESSION_TAKEN_OVER)
        self._node.sessions.release(session)
        self.stats.moved_out += 1
        durable = self._node.durable
        if durable is not None:
            await durable.store.settle()

    def _take_backlog(self, params: Any) -> dict[str, Any]:
        session = self._node.sessions.sessions.get(str(params["id"]))
        if session is None or session.durable or session.connection is not None:
            # Ended, or reconnected here meanwhile (that CONNECT claimed it back): nothing moves.
            return {"inflight": [], "queue": [], "awaiting_rel": [], "next_id": 1}
        backlog = export_backlog(session)
        self._node.sessions.hand_over(session)
        self.stats.moved_out += 1
        return backlog

    # ---- after a partition -----------------------------------------------------------------
    def _connected(self) -> dict[str, Any]:
        """client ID -> connection, for this node's acknowledged connections."""
        return {session.client_id: session.connection
                for session in self._node.sessions.sessions.values()
                if session.connection is not None}

    def _peer_up(self, site: str) -> None:
        task = asyncio.get_running_loop().create_task(self._exchange(site))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _exchange(self, site: str) -> None:
        mine = [[client_id, *connection.claim_stamp]
                for client_id, connection in self._connected().items()]
        try:
            older = await self._rpc.call(site, "client.connected", mine, self._timeout * 4)
        except RpcError as error:
            log.warning("client registry exchange with %s failed: %s", site, error)
            return
        self._end_older(older, self._connected())  # as they are now, after the wait

    def _converge(self, theirs: Any) -> list[str]:
        """Ends this node's older connections of IDs the peer also has connected; returns
        the IDs whose connection on the peer is the older one, for the peer to end."""
        connected = self._connected()
        mine_older, theirs_older = [], []
        for client_id, clock, site in theirs:
            self._observe(clock)
            connection = connected.get(str(client_id))
            if connection is None:
                continue
            if tuple(connection.claim_stamp) < (int(clock), str(site)):
                mine_older.append(str(client_id))
            else:
                theirs_older.append(str(client_id))
        self._end_older(mine_older, connected)
        return theirs_older

    def _end_older(self, client_ids: Any, connected: dict[str, Any]) -> None:
        for client_id in client_ids:
            connection = connected.get(str(client_id))
            if connection is not None:
                self.stats.converged += 1
                log.info("client %s was connected on two nodes (a partition): the older"
                         " connection, here, is ended", client_id)
                connection.take_over(ReasonCode.SESSION_TAKEN_OVER)

    def metrics(self) -> list[tuple[str, str, str, dict[str, str], float]]:
        stats = self.stats
        help_ = "Client-ID takeovers between nodes, by outcome"
        return [("mqtt_cluster_takeovers_total", "counter", help_, {"outcome": outcome},
                 float(value)) for outcome, value in (
            ("moved_in", stats.moved_in), ("moved_out", stats.moved_out),
            ("taken_over", stats.taken_over), ("lost_race", stats.lost_race),
            ("redirected", stats.redirected), ("unanswered", stats.unanswered),
            ("resumed", stats.resumed),
            ("converged", stats.converged))]
