"""Who is in the cluster, who is reachable, and whom to dial next: a pure state machine.

The asyncio shell (`broker.cluster.service`) reports facts (a link came up, went down, a
peer gossiped its member list, an operator removed a node) with the time, and asks whom to
dial. Nodes are known by their site ID, not their address: a pod gets a new IP on every
restart, and a member's address is simply updated from its next handshake.

Agreement: every link up exchanges member lists and every node dials every member it learns
of (full mesh), so all nodes converge on the union. A member that leaves says so; one that
is force-removed is remembered as removed and refused until it explicitly joins again, so
a stale node cannot slip back in and re-add routes nobody expects. A member down longer than
`autoclean` is dropped from the list; if it returns it dials its seeds and rejoins by itself.
A node that comes back under its name with another site lost its data dir (a new volume,
a wiped disk): the site it had is gone for good and is removed as if force-removed, or a
few such returns would leave the Raft groups with more dead voters than live ones.
"""

from enum import Enum
from typing import Any

from broker.cluster.handshake import Identity

Address = tuple[str, int]


class Status(Enum):
    """EMQX's `node_status` values."""

    UP = "running"
    DOWN = "stopped"


class Member:
    """(Plain classes here and below: a dataclass costs a start ~0.5 ms to build, issue 42.)"""

    __slots__ = ("identity", "since", "status")

    def __init__(self, identity: Identity, status: Status, since: float) -> None:
        self.identity = identity
        self.status = status
        self.since = since  # when `status` last changed, on the shell's clock


class _Backoff:
    __slots__ = ("delay", "next_at")

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.next_at = 0.0


class Membership:
    __slots__ = ("_backoff", "_self_addresses", "max_backoff", "me", "members", "min_backoff",
                 "removed", "seeds")

    def __init__(self, me: Identity, seeds: list[Address] | None = None,
                 min_backoff: float = 0.5, max_backoff: float = 10.0) -> None:
        self.me = me
        self.seeds: list[Address] = seeds if seeds is not None else []
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.members: dict[str, Member] = {}
        self.removed: set[str] = set()
        # Addresses that turned out to be this node (a seed list usually names every node).
        self._self_addresses: set[Address] = set()
        self._backoff: dict[Address, _Backoff] = {}

    # ---- facts ---------------------------------------------------------------------------
    def up(self, peer: Identity, now: float) -> bool:
        """A link to `peer` is established; True if it is a member we did not know."""
        self.removed.discard(peer.site)
        self._backoff.pop((peer.host, peer.port), None)
        member = self.members.get(peer.site)
        if member is None:
            self.members[peer.site] = Member(peer, Status.UP, now)
            return True
        member.identity = peer
        if member.status is not Status.UP:
            member.status, member.since = Status.UP, now
        return False

    def replaced_by(self, peer: Identity) -> list[str]:
        """Sites of members that are down and had `peer`'s node name: `peer` is their node,
        back with a new data dir."""
        return [site for site, member in self.members.items()
                if site != peer.site and member.identity.node == peer.node
                and member.status is Status.DOWN]

    def down(self, site: str, now: float) -> bool:
        """The link to `site` is gone; True if it was up."""
        member = self.members.get(site)
        if member is None or member.status is Status.DOWN:
            return False
        member.status, member.since = Status.DOWN, now
        return True

    def learn(self, identities: list[Identity], now: float) -> list[Identity]:
        """A peer's member list: the members we did not know (to dial)."""
        new = []
        for identity in identities:
            if (identity.site == self.me.site or identity.site in self.removed
                    or identity.site in self.members):
                continue
            self.members[identity.site] = Member(identity, Status.DOWN, now)
            new.append(identity)
        return new

    def is_self(self, address: Address) -> None:
        self._self_addresses.add(address)

    def forget(self, site: str) -> bool:
        """Force-removed (by an operator, here or on another node): refused from now on."""
        self.removed.add(site)
        return self.members.pop(site, None) is not None

    def left(self, site: str) -> bool:
        """The node announced it leaves: dropped, but welcome to join again."""
        return self.members.pop(site, None) is not None

    def autoclean(self, now: float, after: float) -> list[str]:
        """Members down for longer than `after` seconds, dropped from the list."""
        gone = [site for site, member in self.members.items()
                if member.status is Status.DOWN and now - member.since >= after]
        for site in gone:
            del self.members[site]
        return gone

    # ---- decisions -----------------------------------------------------------------------
    def dial_targets(self, now: float, connected: set[str]) -> list[Address]:
        """Addresses to dial now: members without a link, and seeds not known to be a
        member or this node; each address at most once per backoff period."""
        known = {(m.identity.host, m.identity.port) for m in self.members.values()}
        wanted = [(m.identity.host, m.identity.port) for site, m in self.members.items()
                  if site not in connected]
        wanted += [seed for seed in self.seeds if seed not in known]
        targets = []
        for address in dict.fromkeys(wanted):
            if address in self._self_addresses or address == (self.me.host, self.me.port):
                continue
            backoff = self._backoff.get(address)
            if backoff is None:
                backoff = self._backoff[address] = _Backoff(self.min_backoff)
            if now < backoff.next_at:
                continue
            backoff.next_at = now + backoff.delay
            backoff.delay = min(backoff.delay * 2, self.max_backoff)
            targets.append(address)
        return targets

    def identities(self) -> list[Identity]:
        """The member list as gossiped: every member we know and ourselves."""
        return [self.me, *(member.identity for member in self.members.values())]

    def incarnations(self) -> dict[str, str]:
        """Each member's data dir as last seen (a gossiped identity does not change it)."""
        return {site: m.identity.incarnation for site, m in self.members.items()}

    def running(self) -> list[str]:
        return [site for site, m in self.members.items() if m.status is Status.UP]

    # ---- persistence: a restarted node dials the members it knew, seeds or not ------------
    def to_json(self) -> dict[str, Any]:
        return {"members": [identity_to_json(m.identity) for m in self.members.values()],
                "removed": sorted(self.removed)}

    def restore(self, saved: dict[str, Any], now: float) -> None:
        for item in saved.get("members", []):
            identity = identity_from_json(item)
            if identity is None:
                continue
            if identity.site != self.me.site:
                self.members.setdefault(identity.site, Member(identity, Status.DOWN, now))
        self.removed.update(saved.get("removed", []))


def identity_to_json(identity: Identity) -> dict[str, Any]:
    return {"site": identity.site, "node": identity.node, "host": identity.host,
            "port": identity.port, "incarnation": identity.incarnation}


def identity_from_json(item: Any) -> Identity | None:
    try:
        return Identity(str(item["site"]), str(item["node"]), str(item["host"]),
                        int(item["port"]), str(item.get("incarnation", "")))
    except (KeyError, TypeError, ValueError):
        return None

