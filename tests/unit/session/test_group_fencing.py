"""What the replicas of `sessions` admit of a durable group's writes (group_fencing.py):
one member reads a shard at a time, whatever the nodes believe."""

from broker.ds import Stream
from broker.session.durable import group_records as g
from broker.session.durable import records as r
from broker.session.durable.ownership import admitted

SHARE = "$share/workers/jobs/#"
STREAM = Stream("messages", 2, 1, 7)


def meta(site: str) -> bytes:
    return r.Meta(60, 5, True, None, None, site, 1).to_bytes()


def store_with(owner: g.Owner | None) -> dict[bytes, bytes]:
    store = {r.meta_key("w1"): meta("A"), r.meta_key("w2"): meta("B")}
    if owner is not None:
        store[g.owner_key(SHARE, 2)] = owner.to_bytes(None)
    return store


def kept(store: dict[bytes, bytes], writer: str,
         writes: list[tuple[bytes, bytes | None]]) -> tuple[list[bytes], set[str]]:
    result, refused = admitted(writer, writes, store.get)
    return [key for key, _ in result], refused


def batch(share: str = SHARE) -> bytes:
    return r.BatchRecord(share, STREAM, 0, 10, 1, 3, 1, False).to_bytes()


def test_an_owner_change_is_admitted_only_over_the_state_it_names() -> None:
    own_w1 = g.Owner("w1", g.OWN)
    store = store_with(own_w1)
    key = g.owner_key(SHARE, 2)
    stale = g.Owner("w2", g.OWN).to_bytes(None)  # decided as if the shard were free
    assert kept(store, "C", [(key, stale)]) == ([], set())
    revoke = g.Owner("w1", g.REVOKE).to_bytes(own_w1)
    assert kept(store, "C", [(key, revoke)]) == ([key], set())


def test_positions_and_batches_only_from_the_node_serving_the_shards_member() -> None:
    store = store_with(g.Owner("w1", g.OWN))
    position = (g.position_key(SHARE, STREAM), b'{"pos":5}')
    assert kept(store, "A", [position])[0] == [position[0]]
    assert kept(store, "B", [position])[0] == []
    record = (r.batch_key("w2", 1), batch())
    # w2's node records a batch of a shard w1 reads: refused, and w2 leaves that node.
    assert kept(store, "B", [record]) == ([], {"w2"})
    assert kept(store, "A", [(r.batch_key("w1", 1), batch())])[0] == [r.batch_key("w1", 1)]
    # A batch of a plain subscription is the session's own business.
    assert kept(store, "B", [(r.batch_key("w2", 1), batch("jobs/#"))])[0] == [
        r.batch_key("w2", 1)]


def test_a_free_shard_takes_no_position() -> None:
    store = store_with(g.Owner(None, g.FREE))
    assert kept(store, "A", [(g.position_key(SHARE, STREAM), b'{"pos":5}')])[0] == []


def test_a_returned_batch_is_taken_only_by_the_shards_reader_or_with_the_group() -> None:
    store = store_with(g.Owner("w2", g.OWN))
    returned = g.returned_key(SHARE, 2, "w1", 1)
    record = r.BatchRecord(SHARE, STREAM, 0, 10, 1, 3, 1, False)
    store[r.batch_key("w1", 1)] = record.to_bytes()
    assert kept(store, "A", [(returned, g.returned_to_bytes(record, False))])[0] == [returned]
    assert kept(store, "B", [(returned, g.returned_to_bytes(record, False))])[0] == []
    store[returned] = g.returned_to_bytes(record, False)
    assert kept(store, "A", [(returned, None)])[0] == []
    assert kept(store, "B", [(returned, None)])[0] == [returned]
    ending = [(returned, None), (g.group_key(SHARE), None)]
    assert sorted(kept(store, "A", ending)[0]) == sorted(key for key, _ in ending)


def test_a_batch_is_handed_back_only_if_its_record_is_stored_or_written_with_it() -> None:
    """A member hands back what it read and did not send, also of a batch whose record is
    on its way; refused, that record's deliveries are the group's already (read again from
    its position), and handed back too they would reach two members."""
    store = store_with(g.Owner("w1", g.OWN))
    returned = g.returned_key(SHARE, 2, "w1", 7)
    record = r.BatchRecord(SHARE, STREAM, 0, 10, 1, 3, 1, False)
    back = (returned, g.returned_to_bytes(record, True))
    assert kept(store, "A", [back])[0] == []
    assert sorted(kept(store, "A", [(r.batch_key("w1", 1), batch()), back])[0]) == sorted(
        [r.batch_key("w1", 1), returned])
    # Read, handed back and completed in one flush: the record is written and deleted again
    # in one command (kv.py keeps both).
    written_and_deleted = [(r.batch_key("w1", 1), batch()), (r.batch_key("w1", 1), None)]
    assert sorted(kept(store, "A", [*written_and_deleted, back])[0]) == sorted(
        [r.batch_key("w1", 1), r.batch_key("w1", 1), returned])
    # A record refused before: deleting it vouches for nothing.
    assert kept(store, "A", [(r.batch_key("w1", 1), None), back])[0] == [r.batch_key("w1", 1)]
    store[g.owner_key(SHARE, 2)] = g.Owner("w2", g.OWN).to_bytes(None)  # the shard moved
    assert kept(store, "A", [(r.batch_key("w1", 1), batch()), back]) == ([], {"w1"})
    assert kept(store, "A", [(r.batch_key("w1", 1), None), back])[0] == [r.batch_key("w1", 1)]
    store[r.batch_key("w1", 1)] = batch()
    assert kept(store, "A", [back])[0] == [returned]


def test_the_group_starts_with_its_first_member() -> None:
    store = store_with(None)
    first = (g.group_key(SHARE), g.group_to_bytes(100))
    assert kept(store, "A", [first])[0] == [first[0]]
    store[first[0]] = first[1]
    assert kept(store, "B", [(g.group_key(SHARE), g.group_to_bytes(200))])[0] == []


def test_returned_batch_keys_round_trip() -> None:
    key = g.returned_key(SHARE, 2, "client/with/slashes", 42)
    assert g.returned_shard(key, SHARE) == 2
    assert g.returned_client(key, SHARE) == "client/with/slashes"


def test_what_a_member_records_of_a_shard_is_admitted_whole_or_not_at_all() -> None:
    """A position never moves without the batch that read up to it; a returned batch never
    goes without the batch that takes it over (the node serves w1 and w2 both)."""
    store = store_with(g.Owner("w1", g.OWN))
    store[r.meta_key("w2")] = meta("A")
    position = g.position_key(SHARE, STREAM)
    by_w2 = [(position, b'{"pos":9,"by":"w2"}'), (r.batch_key("w2", 1), batch())]
    assert kept(store, "A", by_w2) == ([], {"w2"})
    by_w1 = [(position, b'{"pos":9,"by":"w1"}'), (r.batch_key("w1", 1), batch())]
    assert sorted(kept(store, "A", by_w1)[0]) == sorted(key for key, _ in by_w1)
    returned = g.returned_key(SHARE, 2, "w3", 5)
    store[returned] = b'{}'
    taken_by_w2 = [(returned, None), (r.batch_key("w2", 2), batch())]
    assert kept(store, "A", taken_by_w2) == ([], {"w2"})
    assert kept(store, "A", [(returned, None), (r.batch_key("w1", 2), batch())])[0] == [
        returned, r.batch_key("w1", 2)]


def test_a_returned_batch_taken_twice_is_refused_the_second_time() -> None:
    store = store_with(g.Owner("w1", g.OWN))
    returned = g.returned_key(SHARE, 2, "w3", 5)
    store[returned] = b'{}'
    take = [(returned, None), (r.batch_key("w1", 2), batch())]
    assert sorted(kept(store, "A", take)[0]) == sorted(key for key, _ in take)
    del store[returned]
    assert kept(store, "A", take) == ([], {"w1"})


def test_a_read_made_in_an_earlier_hold_of_the_shard_is_refused() -> None:
    """w1's node, cut off, read on while the shard went to w2 and came back to w1: the
    position it recorded names its earlier tenure and is refused, with its batch."""
    store = store_with(None)
    store[g.owner_key(SHARE, 2)] = g.Owner("w1", g.OWN).to_bytes(None, tenure=7)
    earlier = (g.position_key(SHARE, STREAM), b'{"pos":5,"by":"w1","tenure":3}')
    record = (r.batch_key("w1", 1), batch())
    assert kept(store, "A", [earlier, record]) == ([], {"w1"})
    now = (g.position_key(SHARE, STREAM), b'{"pos":5,"by":"w1","tenure":7}')
    assert sorted(kept(store, "A", [now, record])[0]) == sorted([now[0], record[0]])
