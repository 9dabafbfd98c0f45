"""A wildcard read touches only matching data: keys visited are counted, not timed."""

from broker.ds.storage import MESSAGES
from tests.ds.conftest import message, read_all


async def store(storage, batch) -> None:
    for start in range(0, len(batch), 5000):
        await storage.store_batch(MESSAGES, batch[start:start + 5000], sync=False)


def visits(storage, topic_filter: str) -> tuple[int, int]:
    """(messages read, keys visited) for one full read of the filter."""
    before = storage.messages.keys_visited()
    got = read_all(storage, topic_filter)
    return len(got), storage.messages.keys_visited() - before


async def test_one_host_among_ten_thousand_visits_a_ten_thousandth(open_storage) -> None:
    hosts, per_host = 10_000, 4
    storage = open_storage(n_shards=1)
    await store(storage, [message(f"metrics/host{h}/cpu") for _ in range(per_host)
                          for h in range(hosts)])
    lts = storage.messages.created_shards[0].current.lts
    assert "metrics/+/cpu" in {"/".join(lts.structure(s)) for s in lts.streams()}
    stored = storage.messages.created_shards[0].current.stats.messages
    assert stored == hosts * per_host

    found, visited = visits(storage, "metrics/host7777/#")  # in the `metrics/+/cpu` stream
    assert found == per_host
    # an index key and a master key per match, and one end-of-data probe per `next` call
    assert visited <= 2 * per_host + 2
    assert visited * hosts <= 3 * stored  # ~1/10,000 of the data

    found, visited = visits(storage, "metrics/host7/#")  # learned before the threshold
    # its own stream, read in full, and one probe of the `+` stream's index for host7
    assert (found, visited) == (per_host, per_host + 1)

    found, visited = visits(storage, "metrics/+/cpu")
    assert found == stored and visited == stored  # the whole stream, for comparison


async def test_two_fixed_levels_intersect_their_indexes(open_storage) -> None:
    storage = open_storage(n_shards=1, wildcard_thresholds=(1,))
    await store(storage, [message(f"site/b{b}/r{r}") for _ in range(3)
                          for b in range(60) for r in range(60)])
    found, visited = visits(storage, "site/b42/r17")
    assert found == 3
    # a seek per fixed level and the master key per match, plus the leaps between matches:
    # fewer keys than either level's index alone (180 each) holds
    assert visited <= 6 * found + 2
    assert visited < 180 // 4
    found, _ = visits(storage, "site/b42/+")
    assert found == 3 * 60
