"""The bulk decoder against the broker's own: every column of every value as
`broker.ds.ttv.decode_value` reads it, and the same refusals."""

from typing import Any

import pyarrow as pa
import pytest

import ttvarrow
from broker.ds.ttv import TTV, decode_value, encode_value
from broker.mqtt.constants import PropertyId as P
from tests.support.slabdata import sample_messages


def varied() -> list[TTV]:
    """Fields on both sides of the 12 bytes a view holds inline, empty ones, multi-byte
    UTF-8, and values with and without properties next to each other."""
    out = sample_messages(0, 300)
    for i, topic in enumerate(["a", "twelve/bytes", "thirteen/byte", "ä/ö/ü/€" * 3, "x" * 300]):
        out.append(TTV(topic, b"", i % 3, bool(i % 2), "", {}))
        out.append(TTV(topic, bytes(range(256)) * (i + 1), 2, False, "p" * (i * 5)))
        out.append(TTV(topic, b"12 bytes....", 1, True, "ünïcödé-client",
                       {P.USER_PROPERTY: [("ключ", "значение")], P.MESSAGE_EXPIRY_INTERVAL: 0}))
    return out


def reference(values: list[bytes]) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {f.name: [] for f in ttvarrow.FIELDS}
    for value in values:
        ttv = decode_value(value)
        p = ttv.properties
        for name, got in [
            ("topic", ttv.topic), ("timestamp_us", ttv.timestamp), ("payload", ttv.payload),
            ("qos", ttv.qos), ("retain", ttv.retain), ("publisher", ttv.publisher),
            ("content_type", p.get(P.CONTENT_TYPE)),
            ("payload_format", p.get(P.PAYLOAD_FORMAT_INDICATOR)),
            ("response_topic", p.get(P.RESPONSE_TOPIC)),
            ("correlation_data", p.get(P.CORRELATION_DATA)),
            ("message_expiry", p.get(P.MESSAGE_EXPIRY_INTERVAL)),
            ("user_properties", [{"key": k, "value": v} for k, v in p.get(P.USER_PROPERTY, [])]),
        ]:
            columns[name].append(got)
    return columns


def encoded(ttvs: list[TTV]) -> list[bytes]:
    return [encode_value(ttv, 1_700_000_000_000_000 + 7919 * i) for i, ttv in enumerate(ttvs)]


def decoded(values: list[bytes], fields: list[pa.Field] = ttvarrow.FIELDS) -> dict[str, list]:
    columns = ttvarrow.decode(values, fields)
    for field, column in zip(fields, columns, strict=True):
        assert column.type == field.type and len(column) == len(values)
    return {f.name: c.to_pylist() for f, c in zip(fields, columns, strict=True)}


def test_every_column_as_the_reference_decoder_reads_it() -> None:
    values = encoded(varied())
    assert decoded(values) == reference(values)


def test_a_batch_without_properties_and_a_selection_of_columns() -> None:
    values = encoded([TTV(f"sensors/{i}/temp", bytes([i]) * i, i % 3, False, f"d-{i}")
                      for i in range(50)])
    fields = [f for f in ttvarrow.FIELDS if f.name in ("qos", "payload", "message_expiry",
                                                      "user_properties")]
    want = reference(values)
    assert decoded(values, fields) == {f.name: want[f.name] for f in fields}


def test_payload_sizes_without_the_payloads() -> None:
    values = encoded(varied())
    sizes = decoded(values, [ttvarrow.PAYLOAD_SIZE])["payload_size"]
    assert sizes == [len(payload) for payload in reference(values)["payload"]]


def test_a_batch_beyond_what_views_can_address_is_decoded_in_parts(monkeypatch) -> None:
    monkeypatch.setattr(ttvarrow, "_VIEW_OFFSET_LIMIT", 1000)
    values = encoded(varied())
    assert decoded(values) == reference(values)


_GOOD = encode_value(TTV("topic/of/some/length", b"payload", 1, False, "client",
                        {P.USER_PROPERTY: [("k", "v")]}), 1)
_PROPERTIES_AT = 14 + len("topic/of/some/length") + len("client")


@pytest.mark.parametrize("bad", [
    b"\x02" + _GOOD[1:],  # an unknown format version
    _GOOD[:14] + b"\xff\xfe" + _GOOD[16:],  # a topic that is not UTF-8
    _GOOD[:10],  # cut inside the head
    _GOOD[:14 + 4],  # cut inside the topic
    _GOOD[:_PROPERTIES_AT] + b"\x03\x26\x00\x09payload",  # a truncated user property
    _GOOD[:_PROPERTIES_AT] + b"\x02\x7f\x00payload",  # an unknown property
], ids=["version", "utf-8", "head", "topic", "user property", "unknown property"])
def test_a_damaged_value_is_refused_as_the_reference_refuses_it(bad: bytes) -> None:
    with pytest.raises(Exception):  # noqa: B017 - struct.error, IndexError, ValueError...
        decode_value(bad)
    with pytest.raises(ValueError):
        ttvarrow.decode([_GOOD, bad, _GOOD], ttvarrow.FIELDS)
