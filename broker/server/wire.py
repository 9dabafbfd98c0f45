"""Encode a PUBLISH once per variant and reuse it for every subscriber.

In a fan-out the same message goes to many clients with the same (version, QoS, retain);
only the packet identifier differs. The encoded packet is kept on the message with the
offset of its packet identifier, and each delivery splices its own two bytes in, which is
far cheaper than encoding again.
"""

from broker.mqtt.codec import encode_publish
from broker.session.message import Message


def _packet_id_offset(data: bytes, topic_length: int) -> int:
    header = 2
    while data[header - 1] & 0x80:
        header += 1
    return header + 2 + topic_length


def shared_publish(
    message: Message, version: int, qos: int, retain: bool, packet_id: int | None
) -> bytes:
    """The PUBLISH for a message carrying no per-subscriber properties (caller checks)."""
    cache = message.wire
    if cache is None:
        cache = message.wire = {}
    key = (version, qos, retain)
    entry = cache.get(key)
    if entry is None:
        # The first delivery's packet identifier goes straight into the cached encoding;
        # later deliveries of this variant overwrite it.
        data = encode_publish(message.topic, message.payload, qos, retain, False,
                              packet_id, None, version)
        cache[key] = (data, -1)  # the offset is found when a second delivery needs it
        return data
    data, offset = entry
    if packet_id is None:
        return data
    if offset < 0:
        offset = _packet_id_offset(data, len(message.topic.encode()))
        cache[key] = (data, offset)
    return b"".join((data[:offset], packet_id.to_bytes(2, "big"), data[offset + 2:]))
