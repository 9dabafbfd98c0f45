"""Key layout, the TTV value format and iterator serialisation."""

import struct

from hypothesis import given
from hypothesis import strategies as st

from broker.ds import keys
from broker.ds.iterator import Iterator, Stream, read_plan
from broker.ds.ttv import TTV, decode_value, encode_value
from broker.mqtt.constants import PropertyId


def test_ttv_round_trip_keeps_every_field() -> None:
    ttv = TTV("a/b", b"\x00payload", 2, True, "client-1", {
        PropertyId.USER_PROPERTY: [("k", "v"), ("k", "w")],
        PropertyId.MESSAGE_EXPIRY_INTERVAL: 30,
        PropertyId.CORRELATION_DATA: b"\x01\x02",
        PropertyId.CONTENT_TYPE: "text/plain",
    })
    decoded = decode_value(encode_value(ttv, 1234567))
    assert decoded == TTV(ttv.topic, ttv.payload, 2, True, "client-1", ttv.properties, 1234567)


@given(st.text(min_size=1).filter(lambda t: "\x00" not in t), st.binary(),
       st.integers(0, 2), st.booleans(), st.text(), st.integers(0, 2**64 - 1))
def test_ttv_round_trip(topic, payload, qos, retain, publisher, ts) -> None:
    ttv = TTV(topic, payload, qos, retain, publisher, {}, ts)
    assert decode_value(encode_value(ttv, ts)) == ttv


def test_ttv_layout_is_the_documented_one() -> None:
    """What an offline reader (Spark) relies on: the byte offsets in ttv.py's docstring."""
    value = encode_value(TTV("t/1", b"PAY", 1, True, "pub"), 42)
    assert struct.unpack_from(">BBQHH", value) == (1, 0b101, 42, 3, 3)
    assert value[14:17] == b"t/1"
    assert value[17:20] == b"pub"
    assert value[20] == 0  # empty property block
    assert value[21:] == b"PAY"


def test_master_keys_sort_by_time_within_a_stream() -> None:
    prefix = keys.master_prefix(7)
    stamps = [0, 1, 255, 256, 2**40, 2**63]
    encoded = [prefix + keys.pack_u64(t) for t in stamps]
    assert sorted(encoded) == encoded
    assert [keys.timestamp_of(k) for k in encoded] == stamps
    index = keys.index_prefix(7, 0, keys.level_hash("host7")) + keys.pack_u64(99)
    assert keys.timestamp_of(index) == 99
    assert not index.startswith(prefix)  # index ranges never interleave with the master


def test_level_hash_is_stable() -> None:
    # Fixed value: replicas and offline readers compute the same index keys.
    assert keys.level_hash("host7") == 0x641F63473B59D700


def test_edge_records_round_trip() -> None:
    key = keys.edge_key(12, "cpu")
    assert keys.parse_edge(key, keys.pack_u32(13)) == (12, "cpu", 13)


@given(st.text(max_size=30), st.integers(0, 2**16 - 1), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_iterator_round_trip(topic_filter, shard, generation, stream, position) -> None:
    iterator = Iterator(Stream("messages", shard, generation, stream), topic_filter, position)
    raw = iterator.to_bytes()
    assert Iterator.from_bytes(raw) == iterator
    assert len(raw) < 40 + len(topic_filter.encode())


def test_read_plan() -> None:
    structure = ("metrics", "+", "cpu", "+")
    assert read_plan(structure, "metrics/host7/#").fixed == ((0, "host7"),)
    assert read_plan(structure, "metrics/+/cpu/3").fixed == ((1, "3"),)
    assert read_plan(structure, "metrics/h/cpu/3").fixed == ((0, "h"), (1, "3"))
    everything = read_plan(structure, "metrics/#")
    assert everything == read_plan(structure, "metrics/+/cpu/+")
    assert everything.fixed == () and everything.exact
    assert not read_plan(("+", "x"), "#").exact  # `$` topics may hide behind a root `+`
    assert not read_plan(("a", "b"), "a/b/#").exact  # lengths differ: check each topic
