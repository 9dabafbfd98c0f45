"""Forwarded PUBLISHes between nodes: the FORWARD channel's byte format. Pure.

    frame   := entry*
    entry   := flags:u8  targets:u16  target*  length:u32  value
    target  := group:str  filter:str  client:str      (str := length:u16 UTF-8)
    flags   := bit 0: deliver to the receiver's plain subscribers
    value   := the message as Durable Storage stores it (broker/ds/ttv.py), with Message
               Expiry Interval rewritten to the time left when it was forwarded

Each target names a shared-subscription member the publishing node picked. Entries of one
event-loop turn for one peer travel in one frame; the link keeps their order, so one
publisher's messages reach a remote subscriber in the order they were published.
"""

import struct
import time
from typing import Final

from broker.ds.ttv import TTV, decode_value, encode_value
from broker.mqtt.constants import PropertyId
from broker.session.message import Message

PLAIN: Final = 1
_ENTRY: Final = struct.Struct(">BH")
_LENGTH: Final = struct.Struct(">I")
_STR: Final = struct.Struct(">H")
_EXPIRY: Final = PropertyId.MESSAGE_EXPIRY_INTERVAL

Target = tuple[str, str, str]  # (group, filter, client ID)


class ForwardError(ValueError):
    pass


def encode_message(message: Message) -> bytes:
    """Stamps a message that has no timestamp yet with the time it first left this node, on
    the message itself: every later encoding of it (to another peer, or in a session moved
    on a takeover) carries the same stamp, which is how a node recognises one PUBLISH
    reaching it twice."""
    properties = (message.outgoing_properties() if message.expires_at is not None
                  else message.properties)
    if not message.timestamp:
        message.timestamp = int(time.time() * 1e6)
    ttv = TTV(message.topic, message.payload, message.qos, message.retain, message.publisher,
              properties, 0)
    return encode_value(ttv, message.timestamp)


def encode_entry(flags: int, targets: list[Target], value: bytes) -> bytes:
    parts = [_ENTRY.pack(flags, len(targets))]
    for target in targets:
        for text in target:
            data = text.encode()
            parts.append(_STR.pack(len(data)))
            parts.append(data)
    parts.append(_LENGTH.pack(len(value)))
    parts.append(value)
    return b"".join(parts)


def decode_frame(frame: bytes) -> list[tuple[int, list[Target], Message]]:
    entries = []
    pos, end = 0, len(frame)
    try:
        while pos < end:
            flags, count = _ENTRY.unpack_from(frame, pos)
            pos += _ENTRY.size
            targets: list[Target] = []
            for _ in range(count):
                texts = []
                for _ in range(3):
                    (length,) = _STR.unpack_from(frame, pos)
                    pos += _STR.size
                    if pos + length > end:
                        raise ForwardError("target runs past the frame")
                    texts.append(frame[pos:pos + length].decode())
                    pos += length
                targets.append((texts[0], texts[1], texts[2]))
            (length,) = _LENGTH.unpack_from(frame, pos)
            pos += _LENGTH.size
            if pos + length > end:
                raise ForwardError("message runs past the frame")
            entries.append((flags, targets, decode_message(frame[pos:pos + length])))
            pos += length
    except (struct.error, UnicodeDecodeError, IndexError, ValueError) as error:
        raise ForwardError(f"garbled forward frame: {error}") from None
    return entries


def decode_message(value: bytes) -> Message:
    ttv = decode_value(value)
    interval = ttv.properties.get(_EXPIRY)
    expires_at = time.time() + interval if interval is not None else None
    return Message(ttv.topic, ttv.payload, ttv.qos, ttv.retain, ttv.publisher, ttv.properties,
                   ttv.timestamp, expires_at)
