"""The broker's internal form of an application message, independent of any connection."""

import math
import time
from dataclasses import dataclass
from typing import Final

from broker.ds.ttv import TTV
from broker.mqtt.constants import PropertyId
from broker.mqtt.packets import Properties

_EXPIRY: Final = PropertyId.MESSAGE_EXPIRY_INTERVAL
# Properties the broker forwards unchanged to subscribers (MQTT 5.0 section 3.3.2.3); topic alias
# and subscription identifiers are per-connection and are set on delivery.
FORWARDED_PROPERTIES: Final = frozenset({
    PropertyId.PAYLOAD_FORMAT_INDICATOR,
    PropertyId.CONTENT_TYPE,
    PropertyId.RESPONSE_TOPIC,
    PropertyId.CORRELATION_DATA,
    PropertyId.USER_PROPERTY,
})


@dataclass(slots=True)
class Message(TTV):
    """An application message: what Durable Storage stores (its TTV fields, `timestamp` set
    when stored), plus what the broker needs to deliver it."""

    # Wall-clock deadline (time.time()) after which the message must not be delivered.
    expires_at: float | None = None
    # The encoded PUBLISH, shared by every subscriber that needs no per-connection
    # properties (broker.server.wire): the first variant (version, qos, retain) asked for in
    # two slots, as most messages only ever need one, and any others in a dict.
    wire_variant: int = -1
    wire: bytes = b""
    wire_more: dict[int, bytes] | None = None

    def __init__(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                 publisher: str = "", properties: Properties | None = None,
                 timestamp: int = 0, expires_at: float | None = None) -> None:
        # Written out, as TTV's; TTV.__init__ by name: zero-argument super() fails in a
        # slots dataclass (the decorator returns a new class).
        TTV.__init__(self, topic, payload, qos, retain, publisher, properties, timestamp)
        self.expires_at = expires_at
        self.wire_variant = -1
        self.wire = b""
        self.wire_more = None

    def is_expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    def outgoing_properties(self, now: float | None = None) -> Properties:
        """Forwarded properties, with Message Expiry Interval set to the time remaining."""
        props = {k: v for k, v in self.properties.items() if k in FORWARDED_PROPERTIES}
        if self.expires_at is not None:
            remaining = self.expires_at - (now or time.time())
            props[_EXPIRY] = max(1, math.ceil(remaining))
        return props


def stored_message(topic: str, payload: bytes, qos: int, retain: bool, publisher: str,
                   properties: Properties, timestamp: int) -> Message:
    """A message read back from Durable Storage (which makes it: ttv.Make), its expiry
    counted from when it was stored. Made once and shared by every session that reads it
    (ds/recent.py), with its encoded PUBLISH."""
    interval = properties.get(_EXPIRY)
    expires_at = timestamp / 1e6 + interval if interval is not None else None
    return Message(topic, payload, qos, retain, publisher, properties, timestamp, expires_at)


def message_from_publish(
    topic: str, payload: bytes, qos: int, retain: bool, publisher: str, properties: Properties
) -> Message:
    interval = properties.get(_EXPIRY)
    expires_at = time.time() + interval if interval is not None else None
    return Message(topic, payload, qos, retain, publisher, properties, expires_at=expires_at)


def payload_format_ok(payload: bytes, properties: Properties) -> bool:
    """Payload Format Indicator 1 promises UTF-8; the broker must check the promise."""
    if properties.get(PropertyId.PAYLOAD_FORMAT_INDICATOR) != 1:
        return True
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
