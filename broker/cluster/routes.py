"""The cluster route table: which nodes have subscribers for which filters. Pure.

Each node owns its entries and announces them: a plain filter once, however many local
subscribers it has (so a publish is forwarded once per node, never once per subscriber), and
each shared-subscription member individually (the publishing node picks the member, so a
group spread over nodes gets each message once). Announcements are numbered per node: a
gap means something was missed, and the receiver asks for the sender's full set, which is
also what every new link starts with. A node's entries vanish when it is declared down and
come back with its full set when it returns.

Wire form (JSON, on the ROUTES channel): `{"seq": n, "add": [R...], "del": [R...]}`,
`{"sync": n, "routes": [R...]}` and `{"resync": true}`, where R is `[filter, group,
client]` (group and client null for a plain route).
"""

import json
from collections.abc import Hashable, Iterable
from typing import Any, cast

from broker.routing.trie import TopicTrie

Route = tuple[str, str | None, str | None]  # (filter, share group, member client ID)
SharedMember = tuple[str, str]  # (site, client ID)


class LocalRoutes:
    """This node's entries, and the announcements their changes make. (Plain classes, as
    RemoteRoutes: a dataclass costs a start ~0.5 ms to build, issue 42.)"""

    __slots__ = ("_adds", "_dels", "_plain", "_shared", "seq")

    def __init__(self) -> None:
        self.seq = 0
        self._plain: dict[str, int] = {}
        self._shared: set[Route] = set()
        self._adds: list[Route] = []
        self._dels: list[Route] = []

    def add(self, topic_filter: str, group: str | None, client_id: str) -> None:
        if group is None:
            count = self._plain.get(topic_filter, 0)
            self._plain[topic_filter] = count + 1
            if count == 0:
                self._changed(self._adds, self._dels, (topic_filter, None, None))
        else:
            route = (topic_filter, group, client_id)
            if route not in self._shared:
                self._shared.add(route)
                self._changed(self._adds, self._dels, route)

    def remove(self, topic_filter: str, group: str | None, client_id: str) -> None:
        if group is None:
            count = self._plain.get(topic_filter, 0)
            if count > 1:
                self._plain[topic_filter] = count - 1
            elif count == 1:
                del self._plain[topic_filter]
                self._changed(self._dels, self._adds, (topic_filter, None, None))
        else:
            route = (topic_filter, group, client_id)
            if route in self._shared:
                self._shared.discard(route)
                self._changed(self._dels, self._adds, route)

    @staticmethod
    def _changed(into: list[Route], undo: list[Route], route: Route) -> None:
        if route in undo:  # added and removed within one announcement: nothing to say
            undo.remove(route)
        else:
            into.append(route)

    def announcement(self) -> bytes | None:
        """The changes since the last call, or None if there are none."""
        if not self._adds and not self._dels:
            return None
        self.seq += 1
        message = {"seq": self.seq, "add": self._adds, "del": self._dels}
        self._adds, self._dels = [], []
        return json.dumps(message, separators=(",", ":")).encode()

    def full_set(self) -> bytes:
        routes: list[Route] = [(f, None, None) for f in self._plain]
        routes += sorted(self._shared)
        return json.dumps({"sync": self.seq, "routes": routes},
                          separators=(",", ":")).encode()


class RouteError(ValueError):
    pass


def _routes(items: Any) -> list[Route]:
    if not isinstance(items, list):
        raise RouteError("routes must be a list")
    routes = []
    for item in items:
        if (not isinstance(item, list) or len(item) != 3 or not isinstance(item[0], str)
                or (item[1] is None) != (item[2] is None)):
            raise RouteError(f"bad route {str(item)[:80]}")
        routes.append((item[0], item[1], item[2]))
    return routes


_NO_MATCH: tuple[frozenset[str], dict[tuple[str, str], list[SharedMember]]] = (frozenset(), {})


class RemoteRoutes:
    """Every other node's entries, matched against a topic on each publish."""

    __slots__ = ("_by_site", "_cache", "_seq", "_trie")

    def __init__(self) -> None:
        self._trie: TopicTrie[None] = TopicTrie()
        self._by_site: dict[str, set[Route]] = {}
        self._seq: dict[str, int] = {}
        self._cache: dict[str, tuple[frozenset[str],
                                     dict[tuple[str, str], list[SharedMember]]]] = {}

    def __len__(self) -> int:
        return sum(len(routes) for routes in self._by_site.values())

    def receive(self, site: str, payload: bytes) -> bool:
        """Applies one announcement; False when the sender must send its full set (a gap)."""
        try:
            message = json.loads(payload)
        except ValueError:
            raise RouteError("not JSON") from None
        if not isinstance(message, dict):
            raise RouteError("not an object")
        if "sync" in message:
            self.replace(site, _routes(message.get("routes")), int(message["sync"]))
            return True
        seq = int(message.get("seq", 0))
        last = self._seq.get(site)
        if last is None or seq != last + 1:
            return last is not None and seq <= last  # a duplicate is harmless; a gap is not
        self._seq[site] = seq
        routes = self._by_site.setdefault(site, set())
        for route in _routes(message.get("del", [])):
            if route in routes:
                routes.discard(route)
                self._trie.remove(route[0], self._key(site, route))
        for route in _routes(message.get("add", [])):
            if route not in routes:
                routes.add(route)
                self._trie.add(route[0], self._key(site, route), None)
        self._cache.clear()
        return True

    def replace(self, site: str, routes: Iterable[Route], seq: int) -> None:
        self.purge(site)
        mine = self._by_site[site] = set(routes)
        for route in mine:
            self._trie.add(route[0], self._key(site, route), None)
        self._seq[site] = seq
        self._cache.clear()

    def purge(self, site: str) -> int:
        routes = self._by_site.pop(site, set())
        for route in routes:
            self._trie.remove(route[0], self._key(site, route))
        self._seq.pop(site, None)
        self._cache.clear()
        return len(routes)

    @staticmethod
    def _key(site: str, route: Route) -> Hashable:
        return site if route[1] is None else (route[1], site, route[2])

    def match(self, topic: str) -> tuple[frozenset[str], dict[tuple[str, str], list[SharedMember]]]:
        """(sites with a plain route, shared members per (group, filter)) for `topic`."""
        if not self._trie:  # a single node, or peers without subscribers: every publish
            return _NO_MATCH
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        sites: set[str] = set()
        shared: dict[tuple[str, str], list[SharedMember]] = {}
        for topic_filter, key, _ in self._trie.match(topic):
            if isinstance(key, str):
                sites.add(key)
            else:
                member = cast(tuple[str, str, str], key)
                shared.setdefault((member[0], topic_filter), []).append((member[1], member[2]))
        result = (frozenset(sites), shared)
        if len(self._cache) >= 10_000:
            self._cache.clear()
        self._cache[topic] = result
        return result

    def routes(self) -> list[tuple[str, Route]]:
        return [(site, route) for site, routes in sorted(self._by_site.items())
                for route in sorted(routes, key=str)]
