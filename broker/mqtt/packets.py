"""The 15 MQTT control packets as plain data, shared by both protocol versions.

A packet object is what the codec decodes to and encodes from; it holds no version: the
codec is told the version of the connection. Fields that only exist in MQTT 5 (reason codes
on acks, properties) take their v3.1.1 meaning when absent (SUCCESS, no properties).

Properties are a `dict[int, Any]` keyed by `PropertyId` value. Value types:
integers for the integer properties, `str` for UTF-8 strings, `bytes` for Correlation Data
and Authentication Data, `list[tuple[str, str]]` for USER_PROPERTY (wire order, duplicates
kept) and `list[int]` for SUBSCRIPTION_IDENTIFIER (PUBLISH may carry several).

Each packet's `type` is a property rather than a class attribute: the module is compiled
(tools/build_native.py), and a compiled dataclass cannot carry class attributes.
"""

from dataclasses import dataclass, field
from typing import Any

from broker.mqtt.constants import PacketType

Properties = dict[int, Any]


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    client_id: str
    protocol_level: int = 5
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=dict)

    def __init__(self, client_id: str, protocol_level: int = 5, clean_start: bool = True,
                 keepalive: int = 60, username: str | None = None,
                 password: bytes | None = None, will: Will | None = None,
                 properties: Properties | None = None) -> None:
        self.client_id = client_id
        self.protocol_level = protocol_level
        self.clean_start = clean_start
        self.keepalive = keepalive
        self.username = username
        self.password = password
        self.will = will
        self.properties = {} if properties is None else properties

    @property
    def type(self) -> PacketType:
        return PacketType.CONNECT


@dataclass(slots=True)
class Connack:
    session_present: bool = False
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)

    def __init__(self, session_present: bool = False, reason_code: int = 0,
                 properties: Properties | None = None) -> None:
        self.session_present = session_present
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties

    @property
    def type(self) -> PacketType:
        return PacketType.CONNACK


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)

    def __init__(self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False,
                 dup: bool = False, packet_id: int | None = None,
                 properties: Properties | None = None) -> None:
        # Written out: the dataclass-generated __init__ is interpreted even when the module
        # is compiled, ~0.3 us per message; Connect's, Connack's and Disconnect's are too,
        # for the same per connection.
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = {} if properties is None else properties

    @property
    def type(self) -> PacketType:
        return PacketType.PUBLISH


@dataclass(slots=True)
class _Ack:
    """PUBACK, PUBREC, PUBREL and PUBCOMP carry the same fields."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)

    def __init__(self, packet_id: int, reason_code: int = 0,
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties


@dataclass(slots=True, init=False)
class Puback(_Ack):
    @property
    def type(self) -> PacketType:
        return PacketType.PUBACK


@dataclass(slots=True, init=False)
class Pubrec(_Ack):
    @property
    def type(self) -> PacketType:
        return PacketType.PUBREC


@dataclass(slots=True, init=False)
class Pubrel(_Ack):
    @property
    def type(self) -> PacketType:
        return PacketType.PUBREL


@dataclass(slots=True, init=False)
class Pubcomp(_Ack):
    @property
    def type(self) -> PacketType:
        return PacketType.PUBCOMP


@dataclass(slots=True)
class Subscription:
    """One entry of a SUBSCRIBE payload with its MQTT 5 subscription options."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: Properties = field(default_factory=dict)

    @property
    def type(self) -> PacketType:
        return PacketType.SUBSCRIBE


@dataclass(slots=True)
class Suback:
    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=dict)

    @property
    def type(self) -> PacketType:
        return PacketType.SUBACK


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=dict)

    @property
    def type(self) -> PacketType:
        return PacketType.UNSUBSCRIBE


@dataclass(slots=True)
class Unsuback:
    """v3.1.1 UNSUBACK has no payload: `reason_codes` is empty when decoded from v3."""

    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)

    @property
    def type(self) -> PacketType:
        return PacketType.UNSUBACK


@dataclass(slots=True)
class Pingreq:
    @property
    def type(self) -> PacketType:
        return PacketType.PINGREQ


@dataclass(slots=True)
class Pingresp:
    @property
    def type(self) -> PacketType:
        return PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)

    def __init__(self, reason_code: int = 0, properties: Properties | None = None) -> None:
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties

    @property
    def type(self) -> PacketType:
        return PacketType.DISCONNECT


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)

    @property
    def type(self) -> PacketType:
        return PacketType.AUTH


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)
