"""The durable session layout in the sessions database: keys and values round-trip."""

from hypothesis import given
from hypothesis import strategies as st

from broker.ds import Stream
from broker.mqtt.packets import Will
from broker.session.durable import records as r
from broker.session.session import SubscriptionOptions


@given(entries=st.integers(1, 300), data=st.data())
def test_acknowledgement_bitmap_round_trips(entries: int, data: st.DataObject) -> None:
    done = sorted(data.draw(st.sets(st.integers(0, entries - 1))))
    raw = r.acked_to_bytes(done, entries)
    assert len(raw) == (entries + 7) // 8
    assert r.acked_from_bytes(raw) == done


def test_batch_record_and_meta_round_trip() -> None:
    record = r.BatchRecord("a/+/c", Stream("messages", 3, 7, 42), 100, 250, 65_530, 3, 2, True)
    assert r.BatchRecord.from_bytes(record.to_bytes()) == record
    will = Will("w/t", b"\x00bye", 1, True, {0x18: 30, 0x26: [("k", "v"), ("k", "w")]})
    meta = r.Meta(3600, 5, False, 1234.5, will)
    assert r.Meta.from_bytes(meta.to_bytes()) == meta


def test_keys_name_their_client_and_parts() -> None:
    stream = Stream("messages", 2, 9, 77)
    key = r.position_key("dev-1", "a/#", stream)
    assert r.split_key(key) == (b"p", "dev-1")
    assert r.position_parts(key, "dev-1") == ("a/#", 2, 9, 77)
    assert r.seqno_of_key(r.batch_key("dev-1", 123_456)) == 123_456
    assert r.packet_id_of_key(r.awaiting_rel_key("dev-1", 65_535)) == 65_535
    # One client's prefix never covers another whose ID it starts with.
    assert not r.meta_key("dev-10").startswith(r.prefix(b"m", "dev-1"))
    options, since = r.subscription_from_bytes(
        r.subscription_to_bytes(SubscriptionOptions(2, True, True, 1, 9), 555))
    assert (options, since) == (SubscriptionOptions(2, True, True, 1, 9), 555)


def test_packet_ids_follow_sequence_numbers_and_wrap() -> None:
    assert [r.packet_id_of(s) for s in (1, 2, 65_535, 65_536, 65_537)] == [1, 2, 65_535, 1, 2]
