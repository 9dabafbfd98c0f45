"""A STORE command applied by the replicas of a shard: the node that proposed it stores the
messages it holds as objects, every other replica the values it received encoded, with
their timestamps set in place (cook.py, `cook_encoded`). Both must write the very keys and
values `Cooker.cook` would, or the replicas of one shard would differ."""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from broker.ds import TTV, StreamWrite, keys
from broker.ds import replication_layer as cmd
from broker.ds.cook import Cooker, SlabStats
from broker.ds.lts import LTS
from broker.mqtt.constants import PropertyId
from tests.ds.replicas import Replica

PROPERTIES = {PropertyId.CONTENT_TYPE: "text/plain",
              PropertyId.USER_PROPERTY: [("k", "v"), ("k", "w")]}


def batch(n: int) -> list[TTV]:
    """Enough devices under `dev/+/temp` for LTS to learn the level as varying (threshold
    3 below), so index keys are written too; properties, QoS, retain and publishers vary."""
    return [TTV(f"dev/{n}-{i}/temp", b"%d-%d" % (n, i), i % 3, i % 2 == 0, f"pub-{i % 2}",
                PROPERTIES if i % 4 == 0 else {})
            for i in range(10)]


def written(replica: Replica) -> list[tuple[bytes, bytes]]:
    """Every key of the current slab but its creation time (each replica's own clock, as
    the slab was created when the shard was)."""
    return [(key, value) for key, value in replica.machine.shard.current.db.iterator()
            if key != keys.meta_key("created")]


def test_cooking_encoded_values_writes_what_cooking_the_messages_writes() -> None:
    by_objects, by_values = (Cooker(LTS([3]), SlabStats(), 0) for _ in range(2))
    for n in range(5):
        messages = batch(n)
        data = cmd.encode_store(1_000 + n, "site-a", n + 1, messages)
        store = cmd.decode_store(data)
        expected = by_objects.cook(messages, 1_000 + n)
        got = by_values.cook_encoded(store.data, store.spans, None, 1_000 + n)
        assert got.puts == expected.puts
        assert (got.size, got.messages, got.last_timestamp) == (
            expected.size, expected.messages, expected.last_timestamp)
        assert any(value == b"" for _, value in got.puts)  # index keys: the level varies
        assert {stream: [(m.topic, m.timestamp, m.payload, m.properties, m.qos, m.retain,
                          m.publisher) for m in write.messages()]
                for stream, write in got.streams.items()} == {
            stream: [(m.topic, m.timestamp, m.payload, m.properties, m.qos, m.retain,
                      m.publisher) for m in write.messages()]
            for stream, write in expected.streams.items()}


def test_the_proposer_and_a_replica_store_the_same_keys_and_values(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    proposer_sees: list[dict[int, StreamWrite]] = []
    replica_sees: list[dict[int, StreamWrite]] = []
    proposer = Replica(tmp_path / "a", executor,
                       lambda _s, _g, streams: proposer_sees.append(streams or {}))
    replica = Replica(tmp_path / "b", executor,
                      lambda _s, _g, streams: replica_sees.append(streams or {}))
    for index in range(1, 6):
        messages = batch(index)
        data = cmd.encode_store(1_000, "site-a", index, messages)
        proposer.machine.proposing(data, messages)
        proposer.apply(index, data)
        replica.apply(index, data)
        # The proposer's real-time readers get its own objects, timestamps set.
        assert [m for write in proposer_sees[-1].values() for m in write.messages()] == messages
    assert written(replica) == written(proposer)
    assert replica.stored() == proposer.stored()
    assert len(replica.stored()) == 50
    # A replica's readers get the same messages, decoded from what was stored.
    assert [[(m.timestamp, m.topic, m.payload, m.properties) for m in w.messages()]
            for seen in replica_sees for w in seen.values()] == [
        [(m.timestamp, m.topic, m.payload, m.properties) for m in w.messages()]
        for seen in proposer_sees for w in seen.values()]


@pytest.mark.parametrize("garble", [
    lambda value: b"\x02" + value[1:],  # an unknown format version
    lambda value: value[:10] + b"\xff\xff" + value[12:],  # a topic longer than the value
    lambda value: value[:14] + b"\xff" + value[15:],  # a topic that is not UTF-8
])
def test_a_store_with_a_garbled_value_is_skipped_whole_by_every_replica(
        tmp_path: Path, executor: ThreadPoolExecutor,
        garble: Callable[[bytes], bytes]) -> None:
    good = cmd.encode_store(1_000, "site-a", 1, batch(1))
    start = len(cmd.encode_store(1_000, "site-a", 1, [])) + 4  # the first value, after its length
    replica = Replica(tmp_path / "r", executor)
    replica.apply(1, good[:start] + garble(good[start:]))
    replica.apply(2, cmd.encode_store(1_000, "site-a", 2, batch(2)))
    assert replica.machine.bad_commands == 1
    assert replica.machine.applied_index == 2
    assert len(replica.stored()) == 10  # the second command whole, nothing of the first


def test_a_proposer_whose_objects_do_not_match_its_command_stores_the_values(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    """Skipping the command on the proposer alone would set its replica apart from the rest."""
    proposer, replica = Replica(tmp_path / "a", executor), Replica(tmp_path / "b", executor)
    data = cmd.encode_store(1_000, "site-a", 1, batch(1))
    proposer.machine.proposing(data, batch(1)[:3])
    proposer.apply(1, data)
    replica.apply(1, data)
    assert proposer.machine.bad_commands == 0
    assert written(proposer) == written(replica) and len(proposer.stored()) == 10
