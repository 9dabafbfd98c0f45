"""Named streams (broker/session/durable/streams.py): what a stream is on disk, which
durable filter it makes, how a `$stream` subscription's start time is worked out."""

import pytest

from broker.ds import TTV
from broker.mqtt.errors import MQTTError
from broker.session.durable.store import SessionStore
from broker.session.durable.streams import (
    StreamError,
    Streams,
    check_definition,
    parse_offset,
    stream_key,
)

NOW = 1_800_000_000_000_000


@pytest.mark.parametrize(("value", "expected"), [
    (None, 0), ("earliest", 0), ("latest", NOW), ("1700000000000000", 1_700_000_000_000_000),
    ("0", 0),
])
def test_offsets_are_emqx_s_names_or_microseconds(value: str | None, expected: int) -> None:
    assert parse_offset(value, NOW) == expected


@pytest.mark.parametrize("value", ["", "Latest", "-1", "1.5", "1e6", "١٢", "9" * 20])
def test_a_bad_offset_is_0x83_naming_it(value: str) -> None:
    with pytest.raises(MQTTError) as caught:
        parse_offset(value, NOW)
    assert caught.value.reason_code == 0x83 and repr(value) in str(caught.value)


@pytest.mark.parametrize(("name", "topic_filter"), [
    ("", "a"), ("a b", "a"), ("a/b", "a"), ("x" * 256, "a"), ("ok", ""), ("ok", "a/#/b"),
    ("ok", "$share/g/a"), ("ok", "$stream/other"),
])
def test_a_bad_definition_is_refused(name: str, topic_filter: str) -> None:
    with pytest.raises(StreamError):
        check_definition(name, topic_filter)


async def test_a_stream_is_a_durable_filter_from_creation_until_deleted(open_storage) -> None:
    storage = open_storage()
    store = SessionStore(storage)
    changes: list[tuple[str, str | None, str | None]] = []
    streams = Streams(storage, store, lambda *change: changes.append(change))
    made, written = streams.create("plant-1", "sensors/#")
    await written
    assert changes == [("$stream/plant-1", None, "sensors/#")]
    assert streams.create("plant-1", "sensors/#")[0] == made  # the same again: no change
    with pytest.raises(StreamError) as caught:
        streams.create("plant-1", "other/#")
    assert caught.value.conflict and len(changes) == 1
    assert streams.read_filter("$stream/plant-1") == "sensors/#"
    assert streams.read_filter("$stream/plant-1/sensors/#") == "sensors/#"
    assert streams.read_filter("$stream/nope") is None

    # On disk: another node (or this one after a restart) loads the same stream.
    again: list[tuple[str, str | None, str | None]] = []
    loaded = Streams(storage, SessionStore(storage), lambda *change: again.append(change))
    loaded.load()
    assert loaded.all() == [made] and again == changes

    deleted = streams.delete("plant-1")
    assert deleted is not None
    await deleted
    assert changes[-1] == ("$stream/plant-1", "sensors/#", None)
    assert storage.sessions.get(stream_key("plant-1")) is None
    assert streams.delete("plant-1") is None
    loaded.applied(stream_key("plant-1"), None)  # the delete replicated to the other
    assert again[-1] == ("$stream/plant-1", "sensors/#", None) and loaded.all() == []


async def test_a_subscription_starts_no_earlier_than_its_stream(open_storage) -> None:
    storage = open_storage()
    streams = Streams(storage, SessionStore(storage), lambda *change: None)
    made, _ = streams.create("s", "a/+")
    assert streams.resolve("$stream/s", None, False) == ("a/+", made.since)
    assert streams.resolve("$stream/s", "5", False) == ("a/+", made.since)
    assert streams.resolve("$stream/s", str(made.since + 7), False)[1] == made.since + 7
    assert streams.resolve("$stream/s", "latest", False)[1] >= made.since
    for key, auto_create in (("$stream/t", True), ("$stream/t/b", False),
                             ("$stream/s/a/b", True)):
        with pytest.raises(MQTTError) as caught:
            streams.resolve(key, None, auto_create)
        assert caught.value.reason_code == 0x8F, key
    assert streams.resolve("$stream/t/b/#", None, True)[0] == "b/#"  # auto-created
    assert streams.get("t") is not None
    with pytest.raises(MQTTError):
        streams.resolve("$stream/u/#/x", None, True)  # not a filter: nothing created
    assert streams.get("u") is None


async def test_a_reader_that_finished_a_stream_looks_up_its_own_shard_only(
        open_storage) -> None:
    """What follows a finished stream is looked up in its shard: the same streams as the
    whole lookup has for that shard, in the same order, none of another shard's."""
    storage = open_storage(n_shards=4)
    for _ in range(3):  # three generations
        await storage.store_batch("messages", [
            TTV(f"s/{i % 3}", b"x", 1, False, f"pub{i}", {}, 0) for i in range(16)])
        await storage.seal()
    everything = storage.get_streams("messages", "s/+")
    assert {stream.shard for stream in everything} == {0, 1, 2, 3}
    for shard in range(4):
        assert storage.get_streams("messages", "s/+", 0, shard) == [
            stream for stream in everything if stream.shard == shard]


async def test_a_stream_record_that_does_not_parse_is_left_out(open_storage, caplog) -> None:
    storage = open_storage()
    changes: list[tuple[str, str | None, str | None]] = []
    streams = Streams(storage, SessionStore(storage), lambda *change: changes.append(change))
    for raw in (b"{", b'{"filter": "a"}', b'{"filter": 5, "since": 1}',
                b'{"filter": "a/#/b", "since": 1}'):
        streams.applied(stream_key("broken"), raw)
    streams.applied(stream_key("fine"), b'{"filter": "a/#", "since": 1}')
    assert changes == [("$stream/fine", None, "a/#")] and streams.get("broken") is None
    assert caplog.text.count("stream record b't\\x00broken'") == 4
