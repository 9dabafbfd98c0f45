"""One Spark session (local[2]) for the whole test session, and slabs sealed by a real
broker process that keeps running while the jobs read them."""

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

import slabframe
from tests.support.broker_process import BrokerProcess
from tests.support.slabdata import N_SHARDS, sample_messages, write_generations


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = slabframe.session("tests", "local[2]")
    yield session
    session.stop()


@dataclass
class LiveData:
    data_dir: Path
    broker: BrokerProcess
    expected: list[dict[str, Any]]  # every stored message, sealed or not
    sealed_by_broker: int


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveData]:
    """Generation 1 sealed by the library, generation 2 written by the library and sealed
    by the running broker's admin API (the broker does not store publishes in DS yet);
    the broker keeps running, holding every slab open, while the tests read them."""
    data_dir = tmp_path_factory.mktemp("spark-live") / "data"
    expected = write_generations(
        data_dir, [sample_messages(0, 120), sample_messages(120, 80)], [True, False])
    broker = BrokerProcess(data_dir, {"durable_storage.messages.n_shards": str(N_SHARDS)})
    broker.start()
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{broker.ports['http']}/api/v5/ds/storages/messages/generations",
            method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            sealed = json.loads(response.read())["sealed"]
        yield LiveData(data_dir, broker, expected, sealed)
    finally:
        broker.kill()
