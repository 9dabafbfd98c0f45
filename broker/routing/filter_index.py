"""Which topics durable subscribers want stored: (filter, entry) pairs, and how many distinct
entries a topic name matches.

Why not the subscription trie: the index holds every durable session's subscriptions, also
those of the sessions that are offline and out of memory (100,000 and more), and a trie
node per level of each filter costs about 600 bytes per distinct `devices/<id>/cmd`. Most
such filters have no wildcard: those are kept in a dict by the whole filter, matched with
one lookup of the topic name, their entry a plain string while it is the only one (a set
once there are more); only filters with `+` or `#` go to a trie. Entries carry no value:
what a message is stored for does not depend on subscription options.
"""

from collections.abc import Hashable

from broker.routing.trie import TopicTrie


def _has_wildcard(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


class FilterIndex:
    __slots__ = ("_count", "_exact", "_wild")

    def __init__(self) -> None:
        self._exact: dict[str, Hashable | set[Hashable]] = {}
        self._wild: TopicTrie[bool] = TopicTrie()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, topic_filter: str, entry: Hashable) -> bool:
        """True if (filter, entry) was not there before."""
        if _has_wildcard(topic_filter):
            added = self._wild.add(topic_filter, entry, True)
        else:
            exact = self._exact
            present = exact.get(topic_filter)
            if present is None:
                exact[topic_filter] = entry
                added = True
            elif isinstance(present, set):
                added = entry not in present
                present.add(entry)
            else:
                added = present != entry
                if added:
                    exact[topic_filter] = {present, entry}
        self._count += added
        return added

    def remove(self, topic_filter: str, entry: Hashable) -> bool:
        """True if (filter, entry) was there."""
        if _has_wildcard(topic_filter):
            removed = self._wild.remove(topic_filter, entry) is not None
        else:
            exact = self._exact
            present = exact.get(topic_filter)
            if isinstance(present, set):
                removed = entry in present
                present.discard(entry)
                if len(present) == 1:
                    exact[topic_filter] = next(iter(present))
            else:
                removed = present is not None and present == entry
                if removed:
                    del exact[topic_filter]
        self._count -= removed
        return removed

    def matches(self, topic: str) -> int:
        """How many distinct entries have a filter matching the topic name."""
        present = self._exact.get(topic)
        found: set[Hashable] = set(present) if isinstance(present, set) else \
            set() if present is None else {present}
        for _, entry, _ in self._wild.match(topic):
            found.add(entry)
        return len(found)
