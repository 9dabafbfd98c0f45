"""Decides who receives a published message: plain subscriptions and shared groups.

Overlapping subscriptions of one client collapse into one delivery with the highest granted
QoS and every matching Subscription Identifier (MQTT 5.0 section 3.3.4). Each shared group
(`$share/group/filter`) gets one delivery, its member chosen by `SharedDispatch` among the
members here and, in a cluster, those other nodes announced (a remote pick is returned for
forwarding). A route change calls the listener, so the cluster can announce it.
"""

from collections.abc import Callable, Hashable
from typing import Final

from broker.routing.shared import GroupKey, Member, SharedDispatch
from broker.routing.trie import TopicTrie
from broker.session.message import Message
from broker.session.session import Delivery, SubscriptionOptions

_CACHE_LIMIT: Final = 10_000
Match = tuple[str, Hashable, SubscriptionOptions]
# Members of shared groups on other nodes, per (group, filter): [(site, client ID)].
RemoteShared = dict[GroupKey, list[tuple[str, str]]]
# Remote picks, per site: [(group, filter, client ID)].
Forwards = dict[str, list[tuple[str, str, str]]]
# (filter, share group, client ID, added): told of every subscription added or removed.
RouteListener = Callable[[str, str | None, str, bool], None]


class Router:
    def __init__(self, strategy: str = "round_robin") -> None:
        self._trie: TopicTrie[SubscriptionOptions] = TopicTrie()
        self._cache: dict[str, list[Match]] = {}
        self._dispatch = SharedDispatch(strategy)
        self.listener: RouteListener | None = None

    def __len__(self) -> int:
        return len(self._trie)

    def subscribe(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> bool:
        """Adds or replaces; True if this client had no such subscription before."""
        self._cache.clear()
        added = self._trie.add(topic_filter, self._key(client_id, options.share_group), options)
        if added and self.listener is not None:
            self.listener(topic_filter, options.share_group, client_id, True)
        return added

    def unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> bool:
        self._cache.clear()
        removed = self._trie.remove(topic_filter, self._key(client_id, share_group)) is not None
        if removed and self.listener is not None:
            self.listener(topic_filter, share_group, client_id, False)
        return removed

    def route(
        self, message: Message, is_online: Callable[[str], bool], shared: bool = True,
        remote: RemoteShared | None = None, forwards: Forwards | None = None,
    ) -> dict[str, Delivery]:
        """Local deliveries. `shared=False` for a message another node already dispatched to
        shared groups; `remote` members join the local ones, and a remote pick is added to
        `forwards`."""
        matches = self._cache.get(message.topic)
        if matches is None:
            matches = list(self._trie.match(message.topic))
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[message.topic] = matches
        deliveries: dict[str, Delivery] = {}
        groups: dict[GroupKey, list[Member]] | None = None
        publisher = message.publisher
        for topic_filter, key, options in matches:
            if options.share_group is not None:
                if shared:
                    if groups is None:
                        groups = {}
                    group_key = (options.share_group, topic_filter)
                    groups.setdefault(group_key, []).append((key[1], None))  # type: ignore[index]
                continue
            client_id: str = key  # type: ignore[assignment]
            if options.no_local and client_id == publisher:
                continue
            self._merge(deliveries, client_id, message, options)
        if remote:
            if groups is None:
                groups = {}
            for group_key, remote_members in remote.items():
                groups.setdefault(group_key, []).extend((c, s) for s, c in remote_members)
        if groups is not None:
            for group_key, members in groups.items():
                client_id, site = self._dispatch.pick(group_key, members, publisher, is_online)
                if site is None:
                    group_options = self._trie.get(group_key[1], (group_key[0], client_id))
                    assert group_options is not None
                    self._merge(deliveries, client_id, message, group_options)
                elif forwards is not None:
                    forwards.setdefault(site, []).append((group_key[0], group_key[1], client_id))
        return deliveries

    def route_shared(self, message: Message, group: str, topic_filter: str, client_id: str,
                     is_online: Callable[[str], bool]) -> dict[str, Delivery]:
        """A message another node dispatched to a member here. The member may have left
        since: then another local member of the group takes it, if any."""
        options = self._trie.get(topic_filter, (group, client_id))
        if options is None:
            members: list[Member] = [
                (key[1], None) for f, key, o in self._trie.match(message.topic)  # type: ignore[index]
                if o.share_group == group and f == topic_filter
            ]
            if not members:
                return {}
            client_id = self._dispatch.pick((group, topic_filter), members, message.publisher,
                                            is_online)[0]
            options = self._trie.get(topic_filter, (group, client_id))
            assert options is not None
        deliveries: dict[str, Delivery] = {}
        self._merge(deliveries, client_id, message, options)
        return deliveries

    @staticmethod
    def _merge(
        deliveries: dict[str, Delivery], client_id: str, message: Message,
        options: SubscriptionOptions,
    ) -> None:
        qos = options.qos if options.qos < message.qos else message.qos
        retain = message.retain and options.retain_as_published
        identifier = options.identifier
        delivery = deliveries.get(client_id)
        if delivery is None:
            deliveries[client_id] = Delivery(
                message, qos, retain, () if identifier is None else (identifier,)
            )
            return
        delivery.qos = max(delivery.qos, qos)
        delivery.retain = delivery.retain or retain
        if identifier is not None:
            delivery.subscription_ids += (identifier,)

    @staticmethod
    def _key(client_id: str, share_group: str | None) -> Hashable:
        return client_id if share_group is None else (share_group, client_id)
