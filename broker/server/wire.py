"""Encode a PUBLISH once per variant and reuse it for every subscriber.

In a fan-out the same message goes to many clients with the same (version, QoS, retain);
only the packet identifier differs. The encoded packet is kept on the message, and each
delivery splices its own two bytes in, which is far cheaper than encoding again.
"""

from broker.mqtt.codec import encode_publish
from broker.session.message import Message


def _packet_id_offset(data: bytes) -> int:
    """Where a QoS 1/2 PUBLISH's packet identifier starts: after the fixed header and the
    topic name, whose length the packet itself gives."""
    header = 2
    while data[header - 1] & 0x80:
        header += 1
    return header + 2 + (data[header] << 8 | data[header + 1])


def shared_publish(
    message: Message, version: int, qos: int, retain: bool, packet_id: int | None
) -> bytes:
    """The PUBLISH for a message carrying no per-subscriber properties (caller checks)."""
    variant = version << 3 | qos << 1 | (1 if retain else 0)
    if message.wire_variant == variant:
        data = message.wire
    else:
        more = message.wire_more
        cached = more.get(variant) if more is not None else None
        if cached is None:
            # The first delivery's packet identifier goes straight into the cached encoding;
            # later deliveries of this variant overwrite it.
            data = encode_publish(message.topic, message.payload, qos, retain, False,
                                  packet_id, None, version)
            if message.wire_variant < 0:
                message.wire_variant, message.wire = variant, data
            elif more is None:
                message.wire_more = {variant: data}
            else:
                more[variant] = data
            return data
        data = cached
    if packet_id is None:
        return data
    offset = _packet_id_offset(data)
    return b"".join((data[:offset], packet_id.to_bytes(2, "big"), data[offset + 2:]))
