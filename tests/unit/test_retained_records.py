"""Retained-message records: the current format carries any client ID MQTT allows, and a
store written by the first format (1-byte publisher length) still loads as it is."""

import struct
from pathlib import Path

import plyvel
import pytest

from broker.ds.ttv import decode_value, encode_value
from broker.mqtt.codec import encode_publish
from broker.mqtt.constants import MQTT_5
from broker.retainer.store import RetainedStore, decode_record, encode_record
from broker.session.message import Message

PROPERTIES = {0x03: "text/plain", 0x26: [("k", "v")]}


def legacy_record(message: Message) -> bytes:
    """What the first format wrote: expires_at as a double, a 1-byte publisher length."""
    publisher = message.publisher.encode()
    packet = encode_publish(message.topic, message.payload, message.qos, True, False,
                            1 if message.qos else None, message.properties, MQTT_5)
    return struct.pack(">dB", message.expires_at or 0.0, len(publisher)) + publisher + packet


def fields(message: Message) -> tuple[object, ...]:
    return (message.topic, message.payload, message.qos, message.retain, message.publisher,
            message.properties, message.expires_at)


@pytest.mark.parametrize("publisher", ["", "p", "x" * 256, "é" * 30_000, "y" * 65535])
def test_any_client_id_round_trips(publisher: str) -> None:
    message = Message("a/b", b"payload", 1, True, publisher, dict(PROPERTIES),
                      expires_at=1_900_000_000.5)
    assert fields(decode_record(encode_record(message))) == fields(message)


@pytest.mark.parametrize("expires_at", [None, 1_700_000_000.25, 4_000_000_000.0])
def test_records_of_the_first_format_still_decode(expires_at: float | None) -> None:
    message = Message("old/t", b"v1", 2, True, "old-client", dict(PROPERTIES),
                      expires_at=expires_at)
    assert fields(decode_record(legacy_record(message))) == fields(message)


def test_a_store_of_the_first_format_loads_and_takes_new_records(tmp_path: Path) -> None:
    old = Message("old/t", b"v1", 1, True, "old-client", {})
    db = plyvel.DB(str(tmp_path), create_if_missing=True)
    db.put(b"old/t", legacy_record(old))
    db.close()
    store = RetainedStore(tmp_path, 0, 1 << 20, 0)
    try:
        new = Message("new/t", b"v2", 1, True, "z" * 1000, {})
        assert store.put(new)
        assert sorted(fields(m) for m in store.match("#")) == [fields(new), fields(old)]
    finally:
        store.close()
    reopened = RetainedStore(tmp_path, 0, 1 << 20, 0)
    try:
        assert sorted(m.publisher for m in reopened.match("#")) == ["old-client", "z" * 1000]
    finally:
        reopened.close()


def test_stored_messages_keep_the_longest_client_id() -> None:
    """Durable Storage's value format keeps the publisher with a 2-byte length: enough."""
    value = encode_value(Message("t", b"p", 1, False, "w" * 65535, {}), 42)
    assert decode_value(value).publisher == "w" * 65535
