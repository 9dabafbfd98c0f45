"""Durable groups seen from outside: `GET /api/v5/durable_shared_groups` and the metrics
`mqtt_shared_group_backlog` and `mqtt_shared_group_members`.

A group's backlog is counted by reading what it has not read yet from Durable Storage (up
to BACKLOG_CAP messages a stream): work that grows with the groups, their streams and
members, so none of it runs in one go on the event loop. A request's answer is built in
time slices; the metrics are a snapshot that `refresh` rebuilds in time slices every few
seconds, which a scrape only reads, whatever the number of groups (10,000 groups or a
group of 10,000 members cost a scrape nothing more than the samples themselves).
"""

from collections.abc import Callable, Iterator
from typing import Any, Final

from broker.ds import DurableStorage, Stream
from broker.ds import Iterator as DSIterator
from broker.metrics import Sample
from broker.mqtt.topic import parse_shared
from broker.session.durable import group_records as g
from broker.session.durable.groups import GONE, READY, STALLED, Group, GroupManager
from broker.session.durable.session import ds_filter
from broker.session.durable.store import SessionStore
from broker.session.durable.turn import TimeSlice

BACKLOG_CAP: Final = 10_000
"""Messages counted per stream at most."""
_READ: Final = 1_000  # messages read per step of a count
_BACKLOG_DOC: Final = (f"Stored messages a durable shared group has not read yet (counted up"
                       f" to {BACKLOG_CAP} a stream)")
_MEMBERS_DOC: Final = "Members of a durable shared group, by connection state"

Counts = tuple[int, int, int]  # backlog, members connected, members


class GroupViews:
    def __init__(self, groups: GroupManager, ds: DurableStorage, store: SessionStore) -> None:
        self._groups = groups
        self._ds = ds
        self._store = store
        self._counts: dict[str, Counts] = {}

    async def describe(self, node_of: Callable[[str], str | None]) -> list[dict[str, Any]]:
        """Every group, with its members and each stream's backlog."""
        described = []
        budget = TimeSlice()
        manager = self._groups
        for share, group in sorted(manager.groups.items()):
            streams: list[dict[str, Any]] = []
            for _ in self._streams(share, group, streams):
                if budget.spent():
                    await budget.next()
            name, topic_filter = parse_shared(share)
            members = []
            for client_id in sorted(group.members):
                state = manager.state(client_id)
                members.append({"clientid": client_id, "node": node_of(client_id),
                                "connected": state != GONE, "stalled": state == STALLED,
                                "shards": sorted(manager.assigned(share, client_id))})
            described.append({
                "group": name, "filter": topic_filter, "topic": share, "since": group.since,
                "members": members, "backlog": sum(s["backlog"] for s in streams),
                "streams": streams,
            })
            if budget.spent():
                await budget.next()
        return described

    async def refresh(self) -> None:
        """Rebuilds the metrics' snapshot."""
        counts: dict[str, Counts] = {}
        budget = TimeSlice()
        state = self._groups.state
        for share, group in list(self._groups.groups.items()):
            streams: list[dict[str, Any]] = []
            for _ in self._streams(share, group, streams):
                if budget.spent():
                    await budget.next()
            connected = 0
            for n, client_id in enumerate(list(group.members)):
                connected += state(client_id) != GONE
                if n % 100 == 99 and budget.spent():
                    await budget.next()
            counts[share] = (sum(s["backlog"] for s in streams), connected, len(group.members))
        self._counts = counts

    def metrics(self) -> list[Sample]:
        # Declared with no group too, so dashboards and alerts find them.
        samples: list[Sample] = [
            ("mqtt_shared_group_backlog", "gauge", _BACKLOG_DOC, {"group": "", "filter": ""},
             None),
            ("mqtt_shared_group_members", "gauge", _MEMBERS_DOC,
             {"group": "", "filter": "", "state": ""}, None)]
        for share, (backlog, connected, members) in sorted(self._counts.items()):
            name, topic_filter = parse_shared(share)
            assert name is not None
            labels = {"group": name, "filter": topic_filter}
            samples.append(("mqtt_shared_group_backlog", "gauge", _BACKLOG_DOC, labels,
                            float(backlog)))
            for kind, count in (("connected", connected), ("disconnected", members - connected)):
                samples.append(("mqtt_shared_group_members", "gauge", _MEMBERS_DOC,
                                {**labels, "state": kind}, float(count)))
        return samples

    def _streams(self, share: str, group: Group, found: list[dict[str, Any]]
                 ) -> Iterator[None]:
        """Appends each stream the group reads, with what it has not read yet, to `found`;
        yields between steps."""
        read_filter = ds_filter(share)
        streams = self._ds.get_streams("messages", read_filter, group.since)
        positions: dict[Stream, int | None] = {}
        for shard in sorted({stream.shard for stream in streams}):
            positions.update(self._store.load_group_positions(share, shard))
            yield
        for stream in streams:
            owner = group.owners.get(stream.shard)
            reader = owner.client if owner is not None and owner.state != g.FREE else None
            position = positions.get(stream, 0)
            entry = {"shard": stream.shard, "generation": stream.generation,
                     "stream": stream.id, "backlog": 0,
                     "owner": reader if reader and self._groups.state(reader) == READY
                     else None}
            found.append(entry)
            if position is None:
                continue
            iterator: DSIterator | None = DSIterator(
                stream, read_filter, position or max(group.since - 1, 0))
            backlog = 0
            while iterator is not None and backlog < BACKLOG_CAP:
                iterator, ttvs = self._ds.next(iterator, _READ)
                if not ttvs:
                    break
                backlog = entry["backlog"] = min(backlog + len(ttvs), BACKLOG_CAP)
                yield
