"""Random operations and restarts against an in-memory model (hypothesis stateful)."""

import asyncio
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.ds import TTV, Conflict, DurableStorage, Iterator, Settings, now_us
from broker.ds.storage import MESSAGES
from tests.ds.conftest import read_all

TOPICS = ["a", "a/b", "a/c", "d/e/f", "d/g/f", "$sys/x"]
PUBLISHERS = ["p1", "p2", "p3"]
SETTINGS = Settings(n_shards=2, wildcard_thresholds=(2, 1), flush_interval=0.001)


class StorageModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="ds-stateful-"))
        self.storage = self._open()
        self.stored: dict[bytes, tuple[str, str]] = {}  # payload -> (topic, publisher)
        self.ever: set[bytes] = set()
        self.kv: dict[bytes, bytes] = {}
        self.counter = 0
        # a checkpointing reader of "#": iterators kept as bytes, as a session would
        self.checkpoints: dict[tuple[int, int, int], bytes | None] = {}
        self.seen: list[bytes] = []

    def _open(self) -> DurableStorage:
        return DurableStorage(self.dir, SETTINGS)

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    @rule(messages=st.lists(st.tuples(st.sampled_from(TOPICS), st.sampled_from(PUBLISHERS)),
                            min_size=1, max_size=12), sync=st.booleans())
    def store(self, messages: list[tuple[str, str]], sync: bool) -> None:
        batch = []
        for topic, publisher in messages:
            self.counter += 1
            payload = b"%d" % self.counter
            batch.append(TTV(topic, payload, 1, False, publisher))
            self.stored[payload] = (topic, publisher)
            self.ever.add(payload)
        async def store() -> None:
            await self.storage.store_batch(MESSAGES, batch, sync)

        self.run(store())

    @rule()
    def seal(self) -> None:
        self.run(self.storage.seal())

    @rule()
    def restart(self) -> None:
        self.run(self.storage.close())
        self.storage = self._open()

    @rule()
    def drop_everything(self) -> None:
        later = now_us() + int(SETTINGS.retention_period * 1e6) + 10**6
        self.run(self.storage.apply_retention(later))
        self.stored.clear()

    @rule(key=st.sampled_from([b"k1", b"k2", b"k3"]), value=st.one_of(st.none(), st.binary()))
    def transaction(self, key: bytes, value: bytes | None) -> None:
        tx = self.storage.begin()
        assert tx.get(key) == self.kv.get(key)
        stale = self.storage.begin()
        stale.get(key)
        if value is None:
            tx.delete(key)
            self.kv.pop(key, None)
        else:
            tx.put(key, value)
            self.kv[key] = value
        self.run(self.storage.commit(tx))
        stale.put(key, b"stale")
        try:
            self.run(self.storage.commit(stale))
        except Conflict:
            return
        raise AssertionError("a transaction that read a key written since it began committed")

    @precondition(lambda self: self.stored or self.checkpoints)
    @rule()
    def read_incrementally(self) -> None:
        for stream in self.storage.get_streams(MESSAGES, "#"):
            key = (stream.shard, stream.generation, stream.id)
            if key not in self.checkpoints:
                self.checkpoints[key] = self.storage.make_iterator(stream, "#").to_bytes()
        for key, saved in self.checkpoints.items():
            iterator = None if saved is None else Iterator.from_bytes(saved)
            while iterator is not None:
                iterator, batch = self.storage.next(iterator, 5)
                self.seen.extend(m.payload for m in batch)
                if not batch:
                    break
            self.checkpoints[key] = None if iterator is None else iterator.to_bytes()
        assert len(self.seen) == len(set(self.seen)), "a message was delivered twice"
        assert set(self.seen) <= self.ever
        wanted = {p for p, (topic, _) in self.stored.items() if not topic.startswith("$")}
        assert wanted <= set(self.seen), "a stored message was never read"

    @invariant()
    def storage_matches_model(self) -> None:
        got = read_all(self.storage, "#") + read_all(self.storage, "$sys/#")
        assert {m.payload: (m.topic, m.publisher) for m in got} == self.stored
        assert len(got) == len(self.stored)
        per_publisher: dict[str, list[int]] = {}
        for m in sorted(got, key=lambda m: m.timestamp):
            per_publisher.setdefault(m.publisher, []).append(int(m.payload))
        for order in per_publisher.values():
            assert order == sorted(order), "a publisher's messages out of order"
        for key, value in self.kv.items():
            assert self.storage.sessions.get(key) == value

    def teardown(self) -> None:
        self.run(self.storage.close())
        self.loop.close()
        shutil.rmtree(self.dir)


StorageModel.TestCase.settings = settings(max_examples=25, stateful_step_count=20,
                                          deadline=None)
test_storage_against_model = StorageModel.TestCase
