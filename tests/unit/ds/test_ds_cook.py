"""Cooking: deterministic mutations, strictly increasing timestamps, index keys, counters."""

from broker.ds import keys
from broker.ds.cook import STATS_KEY, Cooker, SlabStats
from broker.ds.lts import LTS
from broker.ds.ttv import TTV, decode_value


def cooker(last: int = 0) -> Cooker:
    return Cooker(LTS((2,)), SlabStats(), last)


def batch(*topics: str) -> list[TTV]:
    return [TTV(t, t.encode(), 1, False, "pub") for t in topics]


def test_same_input_same_mutations() -> None:
    messages = batch("a/1", "a/2", "a/3", "a/1", "b")
    one, two = cooker(), cooker()
    assert one.cook(messages, 1000).puts == two.cook(messages, 1000).puts
    assert one.cook(messages, 900).puts == two.cook(messages, 900).puts


def test_timestamps_strictly_increase_even_when_the_clock_steps_back() -> None:
    c = cooker(last=5000)
    first = c.cook(batch("x", "x", "x"), now_us=100)
    stamps = [decode_value(v).timestamp for k, v in first.puts if k.startswith(keys.DATA)]
    assert stamps == [5001, 5002, 5003]
    second = c.cook(batch("x"), now_us=9000)
    assert [decode_value(v).timestamp for k, v in second.puts if k.startswith(keys.DATA)] == [9000]
    assert c.cook(batch("x"), now_us=9000).last_timestamp == 9001


def test_varying_levels_get_index_keys_and_new_edges_are_written() -> None:
    c = cooker()
    cooked = c.cook(batch("a/1", "a/2", "a/3"), 10)  # threshold 2: "3" goes to a/+
    stream, varying = c.lts.learn("a/3", [])
    assert varying == ("3",)
    index = keys.index_prefix(stream, 0, keys.level_hash("3")) + keys.pack_u64(12)
    written = dict(cooked.puts)
    assert written[index] == b""
    assert decode_value(written[keys.master_prefix(stream) + keys.pack_u64(12)]).topic == "a/3"
    edges = sorted(keys.parse_edge(k, v) for k, v in cooked.puts if k.startswith(keys.EDGE))
    assert edges == sorted(c.lts.edges())
    assert set(cooked.streams) == {c.lts.learn(t, [])[0] for t in ("a/1", "a/2", "a/3")}


def test_counters_are_checkpointed_with_the_batch_that_takes_them_far_enough() -> None:
    c = Cooker(LTS((2,)), SlabStats(), 0, checkpoint_bytes=100)
    first = c.cook(batch("a", "b"), 100)  # 68 bytes: short of the checkpoint distance
    assert STATS_KEY not in dict(first.puts)
    second = c.cook(batch("c"), 200)
    stats = SlabStats.decode(dict(second.puts)[STATS_KEY])
    assert stats.messages == 3
    assert stats.size == first.size + second.size
    assert (stats.min_timestamp, stats.max_timestamp) == (100, 200)
    assert STATS_KEY not in dict(c.cook(batch("d"), 300).puts)  # counted from the last one
    assert c.cook([], 400).messages == 0
