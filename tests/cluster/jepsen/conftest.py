"""The `jepsen` fixture: `build(...)` clusters (harness.py) that are all stopped at teardown,
also on failure: workloads first (frozen nodes thawed so that clients can say goodbye), then
the doors; the `cluster` fixture kills the nodes."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import Cluster
from tests.cluster.jepsen.harness import Harness, build


@pytest.fixture
def jepsen(cluster: Cluster) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(count: int = 3, doors: bool = False, code: Path | None = None,
             **settings: str) -> Harness:
        harness = build(cluster, count, doors, code, **settings)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()
