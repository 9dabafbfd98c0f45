"""Errors the codec and the protocol state machine raise.

Each carries the MQTT 5 reason code that the connection must send in its DISCONNECT (or
CONNACK, before the session exists), so that the I/O layer never has to guess.
"""

from broker.mqtt.constants import ReasonCode


class MQTTError(Exception):
    """A violation that ends the connection with `reason_code`."""

    reason_code: ReasonCode = ReasonCode.UNSPECIFIED_ERROR

    def __init__(self, message: str, reason_code: ReasonCode | None = None) -> None:
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code


class MalformedPacket(MQTTError):
    reason_code = ReasonCode.MALFORMED_PACKET


class ProtocolError(MQTTError):
    reason_code = ReasonCode.PROTOCOL_ERROR


class PacketTooLarge(MQTTError):
    reason_code = ReasonCode.PACKET_TOO_LARGE


class UnsupportedProtocolVersion(MQTTError):
    """Raised for a CONNECT whose protocol name/level we do not speak; answered by CONNACK."""

    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
