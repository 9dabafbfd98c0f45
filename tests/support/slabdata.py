"""Known messages in real Durable Storage slabs, for the Spark reader's tests.

The expected rows come from the broker's own read API (get_streams, iterators, the slab's
LTS), not from the Spark code under test, so a test compares two independent read paths.
"""

import asyncio
from pathlib import Path
from typing import Any

from broker.ds import TTV, DurableStorage, Settings
from broker.ds.storage import MESSAGES
from broker.mqtt.constants import PropertyId as P
from tests.ds.conftest import drain

N_SHARDS = 4
TOPICS = [f"plant/{line}/{kind}" for line in (1, 2, 3) for kind in ("temp", "pressure")]
# More devices than the default threshold at depth 1 (10): LTS turns them into `fleet/+/gps`.
TOPICS += [f"fleet/truck{k}/gps" for k in range(14)]
TOPICS += ["alerts/fire", "$SYS/broker/load"]


def sample_messages(first: int, count: int) -> list[TTV]:
    """Every payload is unique (it starts with the message's number) and some are not
    UTF-8; properties vary over all the columns the reader maps."""
    out = []
    for i in range(first, first + count):
        properties: dict[int, Any] = {}
        if i % 3 == 0:
            properties[P.USER_PROPERTY] = [("k", str(i)), ("a", "x"), ("k", "again")]
        if i % 4 == 0:
            properties[P.CONTENT_TYPE] = "application/json"
            properties[P.PAYLOAD_FORMAT_INDICATOR] = 1
        if i % 5 == 0:
            properties[P.RESPONSE_TOPIC] = f"reply/{i}"
            properties[P.CORRELATION_DATA] = bytes([i % 256, 0, 255])
            properties[P.MESSAGE_EXPIRY_INTERVAL] = 3600 + i
        payload = f"{i}:".encode() + (b"\xff\x00" * (i % 7))
        out.append(TTV(TOPICS[i % len(TOPICS)], payload, i % 3, i % 4 == 1,
                       f"device-{i % 9}", properties))
    return out


def expected_rows(storage: DurableStorage) -> list[dict[str, Any]]:
    """Every stored message, as the reader's columns, read through the DS iterators."""
    rows = []
    for topic_filter in ("#", "$SYS/#"):
        for stream in storage.get_streams(MESSAGES, topic_filter):
            slab = storage.messages.shard(stream.shard).slabs[stream.generation]
            structure = "/".join(slab.lts.structure(stream.id))
            for ttv in drain(storage, stream, topic_filter):
                p = ttv.properties
                rows.append({
                    "topic": ttv.topic, "timestamp_us": ttv.timestamp, "payload": ttv.payload,
                    "qos": ttv.qos, "retain": ttv.retain, "publisher": ttv.publisher,
                    "content_type": p.get(P.CONTENT_TYPE),
                    "payload_format": p.get(P.PAYLOAD_FORMAT_INDICATOR),
                    "response_topic": p.get(P.RESPONSE_TOPIC),
                    "correlation_data": p.get(P.CORRELATION_DATA),
                    "message_expiry": p.get(P.MESSAGE_EXPIRY_INTERVAL),
                    "user_properties": [tuple(kv) for kv in p.get(P.USER_PROPERTY, [])],
                    "shard": stream.shard, "generation": stream.generation,
                    "stream": stream.id, "structure": structure,
                })
    return rows


def write_generations(
    data_dir: Path, batches: list[list[TTV]], seal: list[bool]
) -> list[dict[str, Any]]:
    """Stores each batch with the library (no broker running), sealing after those marked;
    returns the expected rows of everything stored."""

    async def write() -> list[dict[str, Any]]:
        storage = DurableStorage(data_dir, Settings(n_shards=N_SHARDS, flush_interval=0.001))
        try:
            for batch, then_seal in zip(batches, seal, strict=True):
                await storage.store_batch(MESSAGES, batch)
                if then_seal:
                    await storage.seal()
            return expected_rows(storage)
        finally:
            await storage.close()

    return asyncio.run(write())
