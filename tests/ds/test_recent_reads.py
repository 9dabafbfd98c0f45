"""Messages read back are decoded once and shared by the readers that read them again
(ds/recent.py), within a bound, and never confused across slabs."""

from pathlib import Path

from broker.ds import DurableStorage, Settings
from broker.ds.recent import MAX_ENTRIES, RecentReads
from broker.ds.storage import MESSAGES
from broker.ds.ttv import encode_value
from broker.session.message import Message, stored_message
from tests.ds.conftest import drain, message


async def test_a_second_reader_gets_the_same_objects_as_the_broker_makes_them(
    tmp_path: Path
) -> None:
    storage = DurableStorage(tmp_path, Settings(n_shards=1, flush_interval=0.001),
                             stored_message)
    try:
        await storage.store_batch(MESSAGES, [
            message("t", payload=b"%d" % i) for i in range(10)] + [
            Message("t", b"expires", 1, False, "pub", {2: 60})])
        (stream,) = storage.get_streams(MESSAGES, "t")
        first = drain(storage, stream, "t")
        again = drain(storage, stream, "t")
        assert [m.payload for m in first] == [b"%d" % i for i in range(10)] + [b"expires"]
        assert all(a is b for a, b in zip(first, again, strict=True))
        assert all(type(m) is Message for m in first)
        expiring = first[-1]
        assert isinstance(expiring, Message) and expiring.expires_at is not None
        assert expiring.expires_at == expiring.timestamp / 1e6 + 60
        assert storage.messages.recent.hits == 11
    finally:
        await storage.close()


def test_other_slabs_messages_under_the_same_key_are_not_confused() -> None:
    recent = RecentReads()
    key = b"\x00k"
    one = encode_value(message("x", payload=b"one"), 5)
    two = encode_value(message("x", payload=b"two"), 5)
    assert recent.decoded(1, key, one).payload == b"one"
    assert recent.decoded(2, key, two).payload == b"two"
    assert recent.decoded(1, key, two).payload == b"one"  # the one read before, not decoded


def test_the_cache_is_bounded_and_keeps_what_is_read_again() -> None:
    recent = RecentReads()
    value = encode_value(message("x", payload=b"p"), 1)
    kept = recent.decoded(0, b"kept", value)
    for i in range(3 * MAX_ENTRIES):
        recent.decoded(0, b"%d" % i, value)
        if i % (MAX_ENTRIES // 2) == 0:
            assert recent.decoded(0, b"kept", value) is kept  # read again: it stays
        assert len(recent) <= 2 * MAX_ENTRIES
    for i in range(2 * MAX_ENTRIES):
        recent.decoded(0, b"other %d" % i, value)
    assert recent.decoded(0, b"kept", value) is not kept  # not read for two generations
