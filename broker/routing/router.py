"""Decides who receives a published message: plain subscriptions and shared groups.

Overlapping subscriptions of one client collapse into one delivery with the highest granted
QoS and every matching Subscription Identifier (MQTT 5.0 section 3.3.4). Each shared group
(`$share/group/filter`) gets one delivery, round-robin, preferring members that are online.
"""

from collections.abc import Callable, Hashable
from typing import Final

from broker.routing.trie import TopicTrie
from broker.session.message import Message
from broker.session.session import Delivery, SubscriptionOptions

_CACHE_LIMIT: Final = 10_000
Match = tuple[str, Hashable, SubscriptionOptions]


class Router:
    def __init__(self) -> None:
        self._trie: TopicTrie[SubscriptionOptions] = TopicTrie()
        self._cache: dict[str, list[Match]] = {}
        self._round_robin: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        return len(self._trie)

    def subscribe(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> bool:
        """Adds or replaces; True if this client had no such subscription before."""
        self._cache.clear()
        return self._trie.add(topic_filter, self._key(client_id, options.share_group), options)

    def unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> bool:
        self._cache.clear()
        return self._trie.remove(topic_filter, self._key(client_id, share_group)) is not None

    def route(self, message: Message, is_online: Callable[[str], bool]) -> dict[str, Delivery]:
        matches = self._cache.get(message.topic)
        if matches is None:
            matches = list(self._trie.match(message.topic))
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[message.topic] = matches
        deliveries: dict[str, Delivery] = {}
        groups: dict[tuple[str, str], list[tuple[str, SubscriptionOptions]]] | None = None
        publisher = message.publisher
        for topic_filter, key, options in matches:
            if options.share_group is not None:
                if groups is None:
                    groups = {}
                group_key = (options.share_group, topic_filter)
                groups.setdefault(group_key, []).append((key[1], options))  # type: ignore[index]
                continue
            client_id: str = key  # type: ignore[assignment]
            if options.no_local and client_id == publisher:
                continue
            self._merge(deliveries, client_id, message, options)
        if groups is not None:
            for group_key, members in groups.items():
                client_id, options = self._pick(group_key, members, is_online)
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

    def _pick(
        self, group_key: tuple[str, str], members: list[tuple[str, SubscriptionOptions]],
        is_online: Callable[[str], bool],
    ) -> tuple[str, SubscriptionOptions]:
        members.sort(key=lambda member: member[0])
        online = [member for member in members if is_online(member[0])] or members
        turn = self._round_robin.get(group_key, 0)
        self._round_robin[group_key] = turn + 1
        return online[turn % len(online)]

    @staticmethod
    def _key(client_id: str, share_group: str | None) -> Hashable:
        return client_id if share_group is None else (share_group, client_id)
