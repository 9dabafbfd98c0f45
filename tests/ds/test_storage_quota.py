"""`durable_storage.messages.storage_quota` on a real storage: over it, the generations past
retention are dropped first (and then nothing is refused if that is enough); still over, durable
writes are refused (StorageRefused, reason db_storage_quota_exceeded) until it is back under."""


import pytest

from broker.ds.space import QUOTA, StorageRefused, tree_bytes
from broker.ds.storage import MESSAGES
from tests.ds.conftest import message

PAYLOAD = bytes(4096)


def _listen(storage) -> list[tuple[str, bool]]:  # type: ignore[no-untyped-def]
    events: list[tuple[str, bool]] = []
    storage.space.listeners.append(lambda reason, text, details: events.append(
        (reason, text is not None)))
    return events


async def _fill(storage, count: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(count):
        await storage.store_batch(MESSAGES, [message(f"q/{i}", payload=PAYLOAD)])


async def test_generations_past_retention_go_before_writes_are_refused(open_storage) -> None:
    # Retention 0: a sealed generation is past it as soon as it is sealed.
    storage = open_storage(n_shards=1, retention_period=0.0)
    await _fill(storage, 50)
    await storage.seal()
    sealed_bytes = tree_bytes(storage.messages.path)
    storage.settings = storage.settings._replace(storage_quota=sealed_bytes // 2)
    events = _listen(storage)
    await storage.watch_space()
    assert [g["state"] for g in storage.info()["databases"][0]["shards"][0]["generations"]] \
        == ["current"]
    assert tree_bytes(storage.messages.path) <= sealed_bytes // 2
    assert events == []
    await storage.store_batch(MESSAGES, [message("after", payload=b"x")])


async def test_over_the_quota_durable_writes_are_refused_until_back_under(
        open_storage) -> None:
    storage = open_storage(n_shards=1, storage_quota=64 << 10)
    events = _listen(storage)
    await _fill(storage, 40)  # 160 KiB of payloads in the current generation, not droppable
    await storage.watch_space()
    assert events == [(QUOTA, True)]
    with pytest.raises(StorageRefused, match="storage_quota") as refused:
        storage.store_batch(MESSAGES, [message("refused", payload=b"x")])
    assert refused.value.reason == QUOTA
    storage.settings = storage.settings._replace(storage_quota=64 << 20)
    await storage.watch_space()
    assert events == [(QUOTA, True), (QUOTA, False)]
    await storage.store_batch(MESSAGES, [message("accepted", payload=b"x")])
