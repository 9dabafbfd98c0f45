"""Public face of the sans-I/O MQTT codec: import from here, not from the modules behind it.

The implementation is split by job: `properties` (wire data types and the MQTT 5 property
block), `encode` (packets to bytes) and `decode` (the streaming `Decoder`).
"""

from broker.mqtt.decode import DEFAULT_MAX_PACKET_SIZE, Decoder
from broker.mqtt.encode import connack_code_v3, encode, encode_ack, encode_publish
from broker.mqtt.properties import encode_properties, encode_varint

__all__ = [
    "DEFAULT_MAX_PACKET_SIZE",
    "Decoder",
    "connack_code_v3",
    "encode",
    "encode_ack",
    "encode_properties",
    "encode_publish",
    "encode_varint",
]
