"""Decoder bugs the fuzzers (fuzz/) found, one test each."""

import gc

import pytest

from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import MQTT_3_1_1, MQTT_5, ReasonCode
from broker.mqtt.errors import MalformedPacket, UnsupportedProtocolVersion
from broker.mqtt.packets import Connect


def test_a_failed_decoder_is_freed_without_the_cycle_collector() -> None:
    """Found by the network fuzzer (fuzz/network.py): the decoder kept the raised error,
    whose traceback holds `feed`'s frame, whose locals hold the decoder and the data: every
    connection ended for a violation waited for a full cycle collection, its last read
    (up to 256 KB) included."""
    gc.collect()
    gc.disable()
    try:
        decoder = Decoder(version=MQTT_5)
        try:
            decoder.feed(b"\x00" * 100_000)
        except MalformedPacket:
            pass
        else:
            pytest.fail("type 0 accepted")
        error = decoder.error
        assert isinstance(error, MalformedPacket)
        assert error.reason_code == ReasonCode.MALFORMED_PACKET
        assert "reserved packet type 0" in str(error)
        try:
            decoder.feed(b"\xc0\x00")
        except MalformedPacket as dead:  # the same class again
            assert dead.reason_code == ReasonCode.MALFORMED_PACKET
        else:
            pytest.fail("a failed decoder accepted more input")
        del decoder, error
        assert gc.collect() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_a_second_connect_with_an_unsupported_level_is_a_protocol_error(version: int) -> None:
    """Found by the network fuzzer: the broker answered it with DISCONNECT 0x84, a reason
    code DISCONNECT does not have (the fuzzer's own decoder refused it). Still an
    UnsupportedProtocolVersion, with the reason code a second CONNECT gets."""
    decoder = Decoder()
    decoder.feed(encode(Connect("c", version), version))
    second = bytearray(encode(Connect("c", MQTT_5), MQTT_5))
    second[8] = 7  # the protocol level
    with pytest.raises(UnsupportedProtocolVersion) as raised:
        decoder.feed(bytes(second))
    assert raised.value.reason_code == ReasonCode.PROTOCOL_ERROR
    assert decoder.version == version
