"""The cluster service of a node: its inter-node listener, its links, and its membership.

A thin asyncio shell around the pure `Membership`: it turns links that come up and go
down, heartbeats that stop, gossip and operator commands into membership facts, and dials
whom membership says to dial. Other parts of the node (routing, Raft, RPC) use it through
`send`, `broadcast`, `on(channel, handler)` and the peer up/down callbacks; they never see
a socket.
"""

import asyncio
import contextlib
import errno
import json
import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from broker.cluster import versions
from broker.cluster.discovery import Discovery
from broker.cluster.frames import Channel
from broker.cluster.handshake import Handshake, Identity, Refused, Role
from broker.cluster.link import PeerLink
from broker.cluster.membership import (
    Address,
    Membership,
    Status,
    identity_from_json,
    identity_to_json,
)
from broker.config.loader import Config
from broker.config.values import split_node_name
from broker.ds.files import write_atomically
from broker.ds.site import ensure_incarnation, ensure_site_id

log = logging.getLogger(__name__)

_MEMBERS_FILE: Final = "members.json"
_COOKIE_FILE: Final = "cookie"
_DIAL_TIMEOUT: Final = 5.0

Handler = Callable[[str, bytes], None]


class ClusterStats:
    """Counters for /metrics; per-peer byte counts live on the links themselves. (A plain
    class: a dataclass costs a start ~0.7 ms to build, issue 42.)"""

    __slots__ = ("dial_failures", "frames_dropped", "link_ups", "refused")

    def __init__(self) -> None:
        self.refused: dict[str, int] = {}
        self.link_ups: dict[str, int] = {}
        self.frames_dropped = 0
        self.dial_failures = 0

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


def load_cookie(config: Config, cluster_dir: Path) -> str:
    """The configured cookie (`node.cookie`, else the file `node.cookie_file` names), else
    one made at first start and kept: never a well-known default that would let anyone who
    reaches the port join. A named file that cannot be read or is empty stops the start: a
    node falling back to a random cookie would run alone while looking configured."""
    configured: str = config["node.cookie"]
    if configured:
        return configured
    cookie_file: str = config["node.cookie_file"]
    if cookie_file:
        try:
            cookie = Path(cookie_file).read_text().strip()
        except OSError as error:
            raise OSError(error.errno, f"node.cookie_file: {error.strerror}",
                          cookie_file) from None
        if not cookie:
            raise OSError(errno.EINVAL, "node.cookie_file: the file is empty", cookie_file)
        return cookie
    path = cluster_dir / _COOKIE_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        cookie = secrets.token_hex(32)
        cluster_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(path, cookie.encode() + b"\n", 0o600)
        log.info("node.cookie not set: made a random one in %s (a node joins only peers"
                 " given the same cookie)", path)
        return cookie


class Cluster:
    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        data_dir = Path(config["node.data_dir"])
        self._dir = data_dir / "cluster"
        self._clock = clock
        self.name: str = config["cluster.name"]
        self._listen: str = config["rpc.listen_address"]
        port: int = config["rpc.tcp_server_port"]
        node_name: str = config["node.name"]
        host, _ = split_node_name(node_name)
        # The cookie on a thread meanwhile: at first start each file is an atomic write,
        # two fsyncs that need not wait for the other file's.
        with ThreadPoolExecutor(1, thread_name_prefix="cookie") as making:
            cookie = making.submit(load_cookie, config, self._dir)
            self.me = Identity(ensure_site_id(data_dir / "ds", config["node.site_id"]),
                               node_name, host, port, ensure_incarnation(data_dir / "ds"))
        self._cookie = cookie.result()
        self._port = port
        self.ticktime: float = config["node.dist_net_ticktime"]
        self.autoclean: float = config["cluster.autoclean"]
        self.discovery = Discovery.from_config(config)
        self.membership = Membership(self.me)
        # The sites this node's Raft groups list (set by the metadata group, if any).
        self.group_sites: Callable[[], set[str]] = set
        # The cluster's effective version (broker/cluster/version_keeper.py, if any): peers
        # whose code cannot run it are refused at the handshake.
        self.cluster_version: Callable[[], int] = lambda: 0
        self.links: dict[str, PeerLink] = {}
        self.stats = ClusterStats()
        self.started_at = time.time()
        self._pending: set[PeerLink] = set()
        self._handlers: dict[int, Handler] = {}
        self._peer_up: list[Callable[[str], None]] = []
        self._peer_down: list[Callable[[str], None]] = []
        self._peer_closed: list[Callable[[str], None]] = []
        self._server: asyncio.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._dialing: dict[Address, asyncio.Task[None]] = {}
        self._left = False
        # `broker ctl cluster join`'s target, dialled with `join` until a link is up: a peer
        # may refuse a removed site for a while (handshake.py: still leaving the groups).
        self._join_target: Address | None = None
        self._dialled = False
        self._joined = False
        self._restore()

    # ---- what other parts of the node use ---------------------------------------------------
    def on(self, channel: Channel, handler: Handler) -> None:
        self._handlers[channel] = handler

    def on_peer_up(self, callback: Callable[[str], None]) -> None:
        self._peer_up.append(callback)

    def on_peer_down(self, callback: Callable[[str], None]) -> None:
        self._peer_down.append(callback)

    def on_peer_closed(self, callback: Callable[[str], None]) -> None:
        """Called after the peer-down callbacks when the link went down because the peer's
        end closed it (EOF or reset: its process died or stopped), not because it fell
        silent for `node.dist_net_ticktime` or this node dropped it: Raft elects at once on
        the former (a frozen or cut-off peer is only ever silent)."""
        self._peer_closed.append(callback)

    def send(self, site: str, channel: Channel, payload: bytes) -> bool:
        """False when there is no link to `site` right now (the caller decides what that
        means: routes resync on the next link up, Raft retries, RPC fails)."""
        link = self.links.get(site)
        if link is None:
            return False
        link.send(channel, payload)
        return True

    def flush(self) -> None:
        """Writes what was sent to every peer now rather than at the end of the loop's
        turn (Raft's messages: see raft/host.py's Transport)."""
        for link in self.links.values():
            link.flush()

    def broadcast(self, channel: Channel, payload: bytes) -> None:
        for link in self.links.values():
            link.send(channel, payload)

    @property
    def joined(self) -> bool:
        """The first discovery round has been dialled through and each of its handshakes
        ended (linked or refused): a node is not Ready before it has tried to join every peer
        it was told of, and a peer that never answers does not keep it unready. Once true it
        stays true: later re-dials of a lost peer do not take a serving node out of its
        Service."""
        if not self._joined and self._dialled:
            self._joined = not any(link.role is Role.DIALER for link in self._pending)
        return self._joined

    def peers(self) -> list[str]:
        """Sites with a link up now."""
        return list(self.links)

    def speaks(self, site: str) -> versions.Speaks | None:
        """The release and cluster versions of the code `site` runs, as its handshake said
        (this node's own for its site); None while no link to it is up."""
        if site == self.me.site:
            return versions.MINE
        link = self.links.get(site)
        return link.handshake.peer_speaks if link is not None else None

    def supports(self, site: str, cluster_version: int) -> bool:
        """Whether `site`, linked now, runs code that takes what cluster version
        `cluster_version` introduced (a message kind only newer code decodes, such as Raft's
        TimeoutNow: versions.TIMEOUT_NOW)."""
        speaks = self.speaks(site)
        return speaks is not None and speaks.highest >= cluster_version

    def refuse_older(self, cluster_version: int) -> None:
        """The cluster rose to `cluster_version`: links to peers whose code cannot run it
        close (each is refused at its next handshake)."""
        for site, link in list(self.links.items()):
            speaks = link.handshake.peer_speaks
            refused = versions.refusal(speaks, cluster_version) if speaks else None
            if refused is not None:
                self.stats.refuse(refused[0])
                log.warning("peer %s dropped: %s", site, refused[1])
                self._drop_link(site)

    # ---- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: self._accept(), self._listen, self._port, reuse_address=True
        )
        if self._port == 0:  # any free port (tests): advertise the one we got
            self._port = self._server.sockets[0].getsockname()[1]
            self.me = self.membership.me = self.me._replace(port=self._port)
        log.info("cluster %s: node %s, site %s", self.name, self.me.node, self.me.site)
        log.info("listener cluster on %s:%d", self._listen, self._port)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for dial in list(self._dialing.values()):
            dial.cancel()
        if self._server is not None:
            self._server.close()
        for link in [*self.links.values(), *self._pending]:
            link.close()
        self._save()

    def _accept(self) -> PeerLink:
        link = PeerLink(self, Role.LISTENER, self._clock)
        self._pending.add(link)
        return link

    async def _run(self) -> None:
        """One round per heartbeat: heartbeats out, silent peers down, discovery, dials."""
        interval = max(self.ticktime / 4, 0.05)
        rounds = 0
        while True:
            now = self._clock()
            for link in list(self.links.values()):
                if now - link.last_rx > self.ticktime:
                    log.warning("peer %s silent for %.1f s: declared down", link.peer.node
                                if link.peer else "?", now - link.last_rx)
                    link.close()
                    self.link_lost(link)
                else:
                    link.heartbeat()
            for link in [link for link in self._pending if now - link.last_rx > self.ticktime]:
                log.warning("inter-node handshake %s %s silent for %.1f s: closed",
                            "to" if link.role is Role.DIALER else "from", link.peername(),
                            now - link.last_rx)
                link.close()
                self.link_lost(link)
            if self.autoclean > 0:
                cleaned = self.membership.autoclean(now, self.autoclean)
                for site in cleaned:
                    log.info("member %s down for %.0f s: removed (cluster.autoclean)", site,
                             self.autoclean)
                if cleaned:
                    self._save()
            if not self._left:
                if rounds % max(1, int(5 / interval)) == 0:
                    self.membership.seeds = await self.discovery.seeds(self._port)
                join_target = self._join_target
                targets = self.membership.dial_targets(now, set(self.links))
                if join_target is not None and not self.links:
                    targets.append(join_target)
                for address in targets:
                    if address not in self._dialing:
                        self._dialing[address] = asyncio.create_task(
                            self._dial(address, join_target is not None))
                if not self._dialled:
                    if self._dialing:
                        await asyncio.wait(list(self._dialing.values()))
                    self._dialled = True
            rounds += 1
            await asyncio.sleep(interval)

    async def _dial(self, address: Address, join: bool = False) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.create_connection(
                lambda: self._dialer(join), address[0], address[1]), _DIAL_TIMEOUT)
        except (TimeoutError, OSError) as error:
            self.stats.dial_failures += 1
            log.debug("dialling %s:%d failed: %s", address[0], address[1], error)
        finally:
            self._dialing.pop(address, None)

    def _dialer(self, join: bool) -> PeerLink:
        link = PeerLink(self, Role.DIALER, self._clock)
        if join:
            link.handshake.join = True
        self._pending.add(link)
        return link

    # ---- LinkOwner -------------------------------------------------------------------------
    def handshake_for(self, role: Role) -> Handshake:
        return Handshake(role, self.me, self.name, self._cookie,
                         refused_sites=frozenset(self.membership.removed),
                         refuse_all="this node left the cluster" if self._left else "",
                         incarnations=self.membership.incarnations(),
                         unsettled=frozenset(self.membership.removed & self.group_sites()),
                         cluster_version=self.cluster_version())

    def link_refused(self, link: PeerLink, error: Refused) -> None:
        self._pending.discard(link)
        self.stats.refuse(error.reason)
        if error.reason == "self":
            self.membership.is_self(self._address_of(link))
        log.warning("inter-node connection %s %s refused: %s", "to" if link.role is Role.DIALER
                    else "from", link.peername(), error)

    def _address_of(self, link: PeerLink) -> Address:
        host, _, port = link.peername().rpartition(":")
        return host, int(port) if port.isdigit() else 0

    def link_up(self, link: PeerLink) -> bool:
        """A handshake finished; False closes the link (a better one to that peer exists)."""
        self._pending.discard(link)
        peer = link.peer
        assert peer is not None
        if link.handshake.readmitted:
            self.membership.removed.discard(peer.site)
            self.broadcast(Channel.MEMBERSHIP, _dump({"type": "readmit", "site": peer.site}))
        existing = self.links.get(peer.site)
        if existing is not None and not existing.closed and not self._replaces(link, existing):
            return False
        self.links[peer.site] = link
        self._join_target = None
        if existing is not None:
            existing.close()
        new = self.membership.up(peer, self._clock())
        self.stats.link_ups[peer.site] = self.stats.link_ups.get(peer.site, 0) + 1
        speaks = link.handshake.peer_speaks
        log.info("peer %s (site %s, release %s) up%s", peer.node, peer.site,
                 speaks.release if speaks else "?", " (new member)" if new else "")
        for site in self.membership.replaced_by(peer):
            log.warning("member %s came back as site %s (a new data dir): its site %s is gone"
                        " for good, removed", peer.node, peer.site, site)
            self.force_leave(site)
        link.send(Channel.MEMBERSHIP, self._members_message())
        self._save()
        for callback in self._peer_up:
            callback(peer.site)
        return True

    def _replaces(self, new: PeerLink, old: PeerLink) -> bool:
        """Two links to one peer (both dialled at once): keep the one the smaller site
        dialled, so both ends keep the same one; a silent old link always loses."""
        if self._clock() - old.last_rx > self.ticktime / 2:
            return True
        return self._dialer_site(new) < self._dialer_site(old)

    def _dialer_site(self, link: PeerLink) -> str:
        assert link.peer is not None
        return self.me.site if link.role is Role.DIALER else link.peer.site

    def link_lost(self, link: PeerLink) -> None:
        self._pending.discard(link)
        peer = link.peer
        if peer is None or self.links.get(peer.site) is not link:
            return
        del self.links[peer.site]
        if self.membership.down(peer.site, self._clock()):
            log.warning("peer %s (site %s) down%s", peer.node, peer.site,
                        " (it closed the link)" if link.closed_by_peer else "")
            for callback in self._peer_down:
                callback(peer.site)
            if link.closed_by_peer:
                for callback in self._peer_closed:
                    callback(peer.site)

    def frame(self, link: PeerLink, channel: int, payload: bytes) -> None:
        assert link.peer is not None
        if channel == Channel.MEMBERSHIP:
            self._membership_frame(link.peer, payload)
            return
        handler = self._handlers.get(channel)
        if handler is None:
            self.stats.frames_dropped += 1
            return
        try:
            handler(link.peer.site, payload)
        except Exception:
            self.stats.frames_dropped += 1
            log.exception("frame on channel %d from %s failed", channel, link.peer.node)

    # ---- membership gossip --------------------------------------------------------------------
    def _members_message(self) -> bytes:
        return _dump({"type": "members",
                      "members": [identity_to_json(i) for i in self.membership.identities()]})

    def _membership_frame(self, peer: Identity, payload: bytes) -> None:
        try:
            message = json.loads(payload)
            kind = message["type"]
        except (ValueError, KeyError, TypeError):
            self.stats.frames_dropped += 1
            return
        now = self._clock()
        if kind == "members":
            identities = [i for i in map(identity_from_json, message.get("members", []))
                          if i is not None]
            if self.membership.learn(identities, now):
                self._save()
        elif kind == "leave":
            if self.membership.left(peer.site):
                log.info("peer %s left the cluster", peer.node)
                self._drop_link(peer.site)
        elif kind == "forget":
            site = str(message.get("site"))
            if site == self.me.site:
                log.warning("this node was removed from the cluster by %s", peer.node)
                self._leave_locally()
            elif self.membership.forget(site):
                log.info("member %s removed from the cluster (by %s)", site, peer.node)
                self._drop_link(site)
                self._save()
        elif kind == "readmit":
            self.membership.removed.discard(str(message.get("site")))
            self._save()
        else:
            self.stats.frames_dropped += 1

    def _drop_link(self, site: str) -> None:
        link = self.links.pop(site, None)
        if link is not None:
            link.close()
            for callback in self._peer_down:
                callback(site)

    # ---- operations (broker ctl cluster ...) ---------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        rows = [{"node": self.me.node, "site": self.me.site, "node_status": "running",
                 "self": True, "address": f"{self.me.host}:{self.me.port}",
                 **_speaks_json(versions.MINE)}]
        for site, member in sorted(self.membership.members.items()):
            identity = member.identity
            link = self.links.get(site)
            rows.append({
                "node": identity.node, "site": site, "node_status": member.status.value,
                "self": False, "address": f"{identity.host}:{identity.port}",
                **_speaks_json(self.speaks(site)),
                "since": member.since, "bytes_sent": link.bytes_sent if link else 0,
                "bytes_received": link.bytes_received if link else 0,
            })
        return rows

    async def join(self, node: str) -> None:
        """Dial `node` (NAME@HOST[:PORT]) now, even if this node left or was removed."""
        host, port = split_node_name(node)
        self._left = False
        self._join_target = (host, port or self._port)
        await self._dial(self._join_target, join=True)

    def leave(self) -> None:
        """Tell every peer this node leaves, then stand alone until `join` or a restart."""
        self.broadcast(Channel.MEMBERSHIP, _dump({"type": "leave"}))
        self._leave_locally()

    def _leave_locally(self) -> None:
        self._left = True
        for site in list(self.links):
            self._drop_link(site)
        self.membership.members.clear()
        self._save()

    def force_leave(self, site_or_node: str) -> bool:
        """Remove a member (usually one that is down for good) on every node that hears."""
        site = next((s for s, m in self.membership.members.items()
                     if site_or_node in (s, m.identity.node)), None)
        if site is None:
            return False
        self.broadcast(Channel.MEMBERSHIP, _dump({"type": "forget", "site": site}))
        self.membership.forget(site)
        self._drop_link(site)
        self._save()
        return True

    def metrics(self) -> list[tuple[str, str, str, dict[str, str], float]]:
        stats = self.stats
        samples: list[tuple[str, str, str, dict[str, str], float]] = []
        for status in Status:
            count = sum(1 for m in self.membership.members.values() if m.status is status)
            samples.append(("mqtt_cluster_members", "gauge",
                            "Cluster members by status, this node included",
                            {"status": status.value},
                            count + (1 if status is Status.UP else 0)))
        for reason, count in sorted(stats.refused.items()):
            samples.append(("mqtt_cluster_peers_refused", "counter",
                            "Inter-node connections refused, by reason", {"reason": reason},
                            count))
        samples.append(("mqtt_cluster_frames_dropped", "counter",
                        "Inter-node frames dropped (unknown channel, garbled, handler failed)",
                        {}, stats.frames_dropped))
        samples.append(("mqtt_cluster_dial_failures", "counter",
                        "Connection attempts to peers that failed", {}, stats.dial_failures))
        samples.append(("mqtt_cluster_version", "gauge",
                        "The cluster's effective version (rises once every member runs code"
                        " that supports it)", {}, self.cluster_version()))
        releases = [(self.me.node, versions.MINE)] + [
            (member.identity.node, self.speaks(site))
            for site, member in sorted(self.membership.members.items())]
        for node, speaks in releases:
            if speaks is not None:
                samples.append(("mqtt_cluster_member_release", "gauge",
                                "Release of each member's code, linked now (value: the highest"
                                " cluster version it runs)",
                                {"peer": node, "release": speaks.release}, speaks.highest))
        for site, member in sorted(self.membership.members.items()):
            peer = {"peer": member.identity.node}
            link = self.links.get(site)
            samples.append(("mqtt_cluster_link_ups", "counter",
                            "Links to a peer established (reconnects = this - 1)", peer,
                            stats.link_ups.get(site, 0)))
            samples.append(("mqtt_cluster_link_bytes_sent", "counter",
                            "Bytes sent to a peer on its current link", peer,
                            link.bytes_sent if link else 0))
            samples.append(("mqtt_cluster_link_bytes_received", "counter",
                            "Bytes received from a peer on its current link", peer,
                            link.bytes_received if link else 0))
        return samples

    # ---- persistence ------------------------------------------------------------------------
    def _save(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self._dir / _MEMBERS_FILE,
                         json.dumps(self.membership.to_json(), indent=1).encode())

    def _restore(self) -> None:
        try:
            saved = json.loads((self._dir / _MEMBERS_FILE).read_text())
        except FileNotFoundError:
            return
        except ValueError:
            log.warning("ignoring unreadable %s", self._dir / _MEMBERS_FILE)
            return
        self.membership.restore(saved, self._clock())


def _dump(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _speaks_json(speaks: versions.Speaks | None) -> dict[str, Any]:
    """A member's release and cluster versions in `cluster status` (None: not linked)."""
    if speaks is None:
        return {"release": None, "cluster_versions": None}
    return {"release": speaks.release, "cluster_versions": [speaks.lowest, speaks.highest]}
