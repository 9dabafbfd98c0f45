"""Broker answers the network fuzzer (fuzz/network.py) found wrong, against a real broker."""

from collections.abc import Callable

from broker.mqtt.codec import encode
from broker.mqtt.constants import MQTT_5, ReasonCode
from broker.mqtt.packets import Connect, Disconnect
from tests.protocol.rawclient import RawClient


def test_second_connect_with_unsupported_level_gets_disconnect_0x82(
    client: Callable[..., RawClient],
) -> None:
    """It got DISCONNECT 0x84, which DISCONNECT does not have: paho or the fuzzer's decoder
    treat that as a malformed packet from the server."""
    raw = client()
    raw.connect("second-connect")
    second = bytearray(encode(Connect("second-connect", MQTT_5), MQTT_5))
    second[8] = 7  # the protocol level
    raw.send_raw(bytes(second))
    packet = raw.recv()
    assert isinstance(packet, Disconnect), packet
    assert packet.reason_code == ReasonCode.PROTOCOL_ERROR
    assert raw.closed_by_broker()
