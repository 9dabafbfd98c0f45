"""Durable groups seen from outside: `GET /api/v5/durable_shared_groups` and the metrics
`mqtt_shared_group_backlog` and `mqtt_shared_group_members`.

A group's backlog is counted by reading what it has not read yet from Durable Storage (up
to BACKLOG_CAP messages a stream). A count is kept with where it stopped (`Backlogs`): it is
taken on from there only once the stream was written, and made again only once the group's
position in it moved, so 10,000 groups that nobody reads cost a pass a look-up per stream,
not a read. The rest of the work still grows with the groups and their members, so none of
it runs in one go on the event loop: the API's answer is built and encoded in time slices;
the metrics are text that `refresh` renders in time slices every few seconds and a scrape
only appends (broker.metrics.Registry), whatever the number of groups.
"""

import json
from array import array
from collections.abc import AsyncIterator, Callable, Collection, Generator, Iterator
from itertools import chain
from typing import Any, Final

from broker.ds import DurableStorage, Stream, StreamWrite
from broker.ds import Iterator as DSIterator
from broker.mqtt.topic import parse_shared
from broker.session.durable import group_records as g
from broker.session.durable.context import ds_filter
from broker.session.durable.groups import GONE, READY, STALLED, Group, GroupManager
from broker.session.durable.store import SessionStore
from broker.session.durable.turn import TimeSlice, run_in_slices
from broker.stats import family_header

BACKLOG_CAP: Final = 10_000
"""Messages counted per stream at most."""
_READ: Final = 1_000  # messages read per step of a count
_MEMBERS_STEP: Final = 100  # members looked at between two checks of the time slice
_BACKLOG: Final = "mqtt_shared_group_backlog"
_BACKLOG_DOC: Final = (f"Stored messages a durable shared group has not read yet (counted up"
                       f" to {BACKLOG_CAP} a stream)")
_MEMBERS: Final = "mqtt_shared_group_members"
_MEMBERS_DOC: Final = "Members of a durable shared group, by connection state"

Counted = tuple[int, int | None, int, int]
"""A group's backlog in a stream as last counted: the group's position it was counted from,
the last timestamp the count examined (None: the end of a sealed stream), the backlog, and
the storage change (`Backlogs`) after which it was counted."""


def count_from(counted: Counted | None, position: int, start: int, written: int,
               cleared: int) -> tuple[int, int] | None:
    """Where a count of a group's backlog in a stream goes on from, and what it starts at:
    from `start` (the group's position) when nothing was counted at this position; from
    where the last count stopped when the stream was `written`, or a generation sealed or
    dropped (`cleared`), after it; None when the last count stands."""
    if counted is None or counted[0] != position:
        return start, 0
    _, examined, backlog, seen = counted
    if examined is None or backlog >= BACKLOG_CAP or max(written, cleared) <= seen:
        return None
    return examined, backlog


_ROW: Final = 5  # a stream's count: shard << 32 | generation, stream, position, examined, backlog
_END: Final = -1  # examined: the end of a sealed stream


class Backlogs:
    """Each group's backlog per stream, counted again only where storage or the group's
    position changed since (`count_from`). Storage tells of every write, seal and drop
    (DurableStorage.change_listeners); each is a numbered change, and a count is valid as
    long as no change touched its stream after the one its pass began after. A group's
    counts are a row of integers a stream (10,000 groups of 16 streams: 8 MiB, not 45 as
    objects), in the order the last pass met the streams."""

    def __init__(self, ds: DurableStorage) -> None:
        self._ds = ds
        self._change = 0
        self._written: dict[tuple[int, int, int], int] = {}  # stream -> its last write
        self._cleared = 0  # the last seal or drop
        self._counted: dict[str, tuple[int, array[int]]] = {}  # share -> its pass, its rows
        ds.change_listeners.append(self._changed)

    def _changed(self, shard: int, generation: int,
                 streams: dict[int, StreamWrite] | None) -> None:
        self._change += 1
        if streams is not None:
            for stream_id in streams:
                self._written[(shard, generation, stream_id)] = self._change
            return
        # A generation sealed or dropped: its streams' writes are forgotten (they would
        # pile up with the generations), which every count made before now must not miss.
        self._cleared = self._change
        self._written = {key: change for key, change in self._written.items()
                         if key[:2] != (shard, generation)}

    def count(self, share: str, since: int, read_filter: str, streams: list[Stream],
              positions: dict[Stream, int | None]) -> Generator[None, None, list[int]]:
        """The group's backlog in each stream from its position there (none: from where
        the group started, `since`; None: read to the end); yields between reads."""
        seen, before = self._counted.get(share, (0, array("q")))
        rows = array("q")
        backlogs: list[int] = []
        began = self._change
        for n, stream in enumerate(streams):
            position = positions.get(stream, 0)
            if position is None:
                backlogs.append(0)
                continue
            counted = _counted(before, n, stream, seen)
            written = self._written.get((stream.shard, stream.generation, stream.id), 0)
            start = count_from(counted, position, position or max(since - 1, 0), written,
                               self._cleared)
            if start is None:
                assert counted is not None
                examined, backlog = counted[1], counted[2]
            else:
                examined, backlog = yield from self._read(stream, read_filter, *start)
            rows.extend((stream.shard << 32 | stream.generation, stream.id, position,
                         _END if examined is None else examined, backlog))
            backlogs.append(backlog)
        self._counted[share] = (began, rows)
        return backlogs

    def _read(self, stream: Stream, read_filter: str, after: int,
              backlog: int) -> Generator[None, None, tuple[int | None, int]]:
        iterator = DSIterator(stream, read_filter, after)
        while backlog < BACKLOG_CAP:
            following, ttvs = self._ds.next(iterator, _READ)
            backlog = min(backlog + len(ttvs), BACKLOG_CAP)
            if following is None:
                return None, backlog
            iterator = following
            if not ttvs:
                break
            yield
        return iterator.position, backlog

    def forget(self, shares: Collection[str]) -> None:
        """Forgets the counts of groups that ended (not in `shares`)."""
        for share in [share for share in self._counted if share not in shares]:
            del self._counted[share]


def _counted(rows: "array[int]", hint: int, stream: Stream, seen: int) -> Counted | None:
    """The stream's count in a group's `rows`: at its place in the last pass (`hint`), or
    looked for."""
    slab, count = stream.shard << 32 | stream.generation, len(rows) // _ROW
    for row in chain((hint,), range(count)):
        at = row * _ROW
        if row < count and rows[at] == slab and rows[at + 1] == stream.id:
            examined = rows[at + 3]
            return rows[at + 2], None if examined == _END else examined, rows[at + 4], seen
    return None


class GroupViews:
    def __init__(self, groups: GroupManager, ds: DurableStorage, store: SessionStore) -> None:
        self._groups = groups
        self._ds = ds
        self._store = store
        self._backlogs = Backlogs(ds)
        # Declared with no group too, so dashboards and alerts find them.
        self._exposition = _render([], [])

    async def describe(self, node_of: Callable[[str], str | None]) -> AsyncIterator[bytes]:
        """The API's answer in JSON (`{"data": [...], "meta": {"count": n}}`): every group,
        with its members and each stream's backlog, in pieces as it is built between time
        slices (10,000 groups: 12 MB, which encoded and written in one go held the loop
        for 40 ms)."""
        parts: list[str] = []
        budget = TimeSlice()
        for _ in self._describe(node_of, parts):
            if budget.spent():
                yield "".join(parts).encode()
                parts.clear()
                await budget.next()
        yield "".join(parts).encode()

    def _describe(self, node_of: Callable[[str], str | None], parts: list[str]
                  ) -> Iterator[None]:
        manager = self._groups
        parts.append('{"data": [')
        count = 0
        for share, group in sorted(manager.groups.items()):
            streams: list[dict[str, Any]] = []
            yield from self._streams(share, group, streams)
            name, topic_filter = parse_shared(share)
            fields = json.dumps({
                "group": name, "filter": topic_filter, "topic": share, "since": group.since,
                "backlog": sum(s["backlog"] for s in streams), "streams": streams})
            # The members go in as the object's last field, a hundred at a time.
            parts.append(f'{", " if count else ""}{fields[:-1]}, "members": [')
            shards = _shards_by_member(group)
            for n, client_id in enumerate(sorted(group.members)):
                state = manager.state(client_id)
                parts.append(("" if n == 0 else ", ") + json.dumps({
                    "clientid": client_id, "node": node_of(client_id),
                    "connected": state != GONE, "stalled": state == STALLED,
                    "shards": shards.get(client_id, [])}))
                if n % _MEMBERS_STEP == _MEMBERS_STEP - 1:
                    yield
            parts.append("]}")
            count += 1
            yield
        parts.append(f'], "meta": {{"count": {count}}}}}')

    async def refresh(self) -> None:
        """Renders the metrics again, in time slices."""
        rest = run_in_slices(self._refresh())
        if rest is not None:
            await rest

    def _refresh(self) -> Iterator[None]:
        backlogs: list[str] = []
        members: list[str] = []
        state = self._groups.state
        if self._groups.groups:
            # Not at module level: prometheus_client comes with the HTTP API, once the MQTT
            # listeners serve (broker/server/http_listener.py).
            from broker.metrics import sample_line
        for share, group in sorted(self._groups.groups.items()):
            streams: list[dict[str, Any]] = []
            yield from self._streams(share, group, streams)
            connected = 0
            for n, client_id in enumerate(list(group.members)):
                connected += state(client_id) != GONE
                if n % _MEMBERS_STEP == _MEMBERS_STEP - 1:
                    yield
            name, topic_filter = parse_shared(share)
            assert name is not None
            labels = {"group": name, "filter": topic_filter}
            backlogs.append(sample_line(_BACKLOG, labels,
                                        float(sum(s["backlog"] for s in streams))))
            for kind, count in (("connected", connected),
                                ("disconnected", len(group.members) - connected)):
                members.append(sample_line(_MEMBERS, {**labels, "state": kind}, float(count)))
            yield
        self._exposition = _render(backlogs, members)
        self._backlogs.forget(self._groups.groups)

    def exposition(self) -> bytes:
        """The metrics, as `refresh` last rendered them."""
        return self._exposition

    def _streams(self, share: str, group: Group, found: list[dict[str, Any]]
                 ) -> Iterator[None]:
        """Appends each stream the group reads, with what it has not read yet, to `found`;
        yields between steps."""
        read_filter = ds_filter(share)
        streams = self._ds.get_streams("messages", read_filter, group.since)
        positions = self._store.load_group_positions(share) if streams else {}
        yield
        backlogs = yield from self._backlogs.count(share, group.since, read_filter, streams,
                                                   positions)
        for stream, backlog in zip(streams, backlogs, strict=True):
            owner = group.owners.get(stream.shard)
            reader = owner.client if owner is not None and owner.state != g.FREE else None
            found.append({"shard": stream.shard, "generation": stream.generation,
                          "stream": stream.id, "backlog": backlog,
                          "owner": reader if reader and self._groups.state(reader) == READY
                          else None})


def _shards_by_member(group: Group) -> dict[str, list[int]]:
    """The shards given to each member (`own`), in order."""
    shards: dict[str, list[int]] = {}
    for shard, owner in sorted(group.owners.items()):
        if owner.client is not None and owner.state == g.OWN:
            shards.setdefault(owner.client, []).append(shard)
    return shards


def _render(backlogs: list[str], members: list[str]) -> bytes:
    return "".join([family_header(_BACKLOG, "gauge", _BACKLOG_DOC), *backlogs,
                    family_header(_MEMBERS, "gauge", _MEMBERS_DOC), *members]).encode()
