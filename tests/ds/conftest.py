from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from broker.ds import TTV, DurableStorage, Settings, Stream
from broker.ds.storage import MESSAGES


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as pool:
        yield pool


@pytest.fixture
async def open_storage(tmp_path: Path) -> AsyncIterator[Callable[..., DurableStorage]]:
    """Opens storages on tmp_path (settings overridable); whatever is open is closed at the
    end, also when a test fails."""
    opened: list[DurableStorage] = []

    def open_(data_dir: Path | None = None, **settings: object) -> DurableStorage:
        defaults: dict[str, object] = {"n_shards": 2, "flush_interval": 0.001}
        storage = DurableStorage(data_dir or tmp_path, Settings(**{**defaults, **settings}))
        opened.append(storage)
        return storage

    yield open_
    for storage in opened:
        if not storage.sessions._db.closed:
            await storage.close()


def read_all(storage: DurableStorage, topic_filter: str, start_time: int = 0) -> list[TTV]:
    """Every stored message matching the filter, by draining an iterator per stream."""
    out: list[TTV] = []
    for stream in storage.get_streams(MESSAGES, topic_filter, start_time):
        out.extend(drain(storage, stream, topic_filter, start_time))
    return out


def drain(storage: DurableStorage, stream: Stream, topic_filter: str, start: int = 0) -> list[TTV]:
    out: list[TTV] = []
    iterator = storage.make_iterator(stream, topic_filter, start)
    while iterator is not None:
        iterator, batch = storage.next(iterator, 7)
        if not batch and iterator is not None:
            break  # end of the data written so far (current generation)
        out.extend(batch)
    return out


def message(topic: str, publisher: str = "pub", payload: bytes | None = None) -> TTV:
    return TTV(topic, payload if payload is not None else topic.encode(), 1, False, publisher)
