"""What a decoder keeps after a violation: the error, not the bytes it failed on."""

import gc

import pytest

from broker.mqtt.codec import Decoder
from broker.mqtt.constants import MQTT_5, ReasonCode
from broker.mqtt.errors import MalformedPacket


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
