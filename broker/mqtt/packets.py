"""The 15 MQTT control packets as plain data, shared by both protocol versions.

A packet object is what the codec decodes to and encodes from; it holds no version: the
codec is told the version of the connection. Fields that only exist in MQTT 5 (reason codes
on acks, properties) take their v3.1.1 meaning when absent (SUCCESS, no properties).

Properties are a `dict[int, Any]` keyed by `PropertyId` value. Value types:
integers for the integer properties, `str` for UTF-8 strings, `bytes` for Correlation Data
and Authentication Data, `list[tuple[str, str]]` for USER_PROPERTY (wire order, duplicates
kept) and `list[int]` for SUBSCRIPTION_IDENTIFIER (PUBLISH may carry several).

Each packet's `type` is a property rather than a class attribute: the module is compiled
(tools/build_native.py). Packets are records (record.py) rather than dataclasses: a start
imports them all, and each dataclass costs about 1 ms of CPU to define; their `__init__` is
written out, which a compiled module runs natively (~0.3 us less per message than an
interpreted one).
"""

from typing import Any

from broker.mqtt.constants import PacketType
from broker.mqtt.record import Record

Properties = dict[int, Any]


class Will(Record):
    __match_args__ = ("topic", "payload", "qos", "retain", "properties")
    __slots__ = __match_args__

    def __init__(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                 properties: Properties | None = None) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = {} if properties is None else properties


class Connect(Record):
    __match_args__ = ("client_id", "protocol_level", "clean_start", "keepalive",
                      "username", "password", "will", "properties")
    __slots__ = __match_args__

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


class Connack(Record):
    __match_args__ = ("session_present", "reason_code", "properties")
    __slots__ = __match_args__

    def __init__(self, session_present: bool = False, reason_code: int = 0,
                 properties: Properties | None = None) -> None:
        self.session_present = session_present
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties

    @property
    def type(self) -> PacketType:
        return PacketType.CONNACK


class Publish(Record):
    __match_args__ = ("topic", "payload", "qos", "retain", "dup", "packet_id",
                      "properties")
    __slots__ = __match_args__

    def __init__(self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False,
                 dup: bool = False, packet_id: int | None = None,
                 properties: Properties | None = None) -> None:
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


class _Ack(Record):
    """PUBACK, PUBREC, PUBREL and PUBCOMP carry the same fields."""

    __match_args__ = ("packet_id", "reason_code", "properties")
    __slots__ = __match_args__

    def __init__(self, packet_id: int, reason_code: int = 0,
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties


class Puback(_Ack):
    __slots__ = ()

    @property
    def type(self) -> PacketType:
        return PacketType.PUBACK


class Pubrec(_Ack):
    __slots__ = ()

    @property
    def type(self) -> PacketType:
        return PacketType.PUBREC


class Pubrel(_Ack):
    __slots__ = ()

    @property
    def type(self) -> PacketType:
        return PacketType.PUBREL


class Pubcomp(_Ack):
    __slots__ = ()

    @property
    def type(self) -> PacketType:
        return PacketType.PUBCOMP


class Subscription(Record):
    """One entry of a SUBSCRIBE payload with its MQTT 5 subscription options."""

    __match_args__ = ("topic_filter", "qos", "no_local", "retain_as_published",
                      "retain_handling")
    __slots__ = __match_args__

    def __init__(self, topic_filter: str, qos: int = 0, no_local: bool = False,
                 retain_as_published: bool = False, retain_handling: int = 0) -> None:
        self.topic_filter = topic_filter
        self.qos = qos
        self.no_local = no_local
        self.retain_as_published = retain_as_published
        self.retain_handling = retain_handling


class Subscribe(Record):
    __match_args__ = ("packet_id", "subscriptions", "properties")
    __slots__ = __match_args__

    def __init__(self, packet_id: int, subscriptions: list[Subscription],
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.subscriptions = subscriptions
        self.properties = {} if properties is None else properties

    @property
    def type(self) -> PacketType:
        return PacketType.SUBSCRIBE


class Suback(Record):
    __match_args__ = ("packet_id", "reason_codes", "properties")
    __slots__ = __match_args__

    def __init__(self, packet_id: int, reason_codes: list[int],
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.reason_codes = reason_codes
        self.properties = {} if properties is None else properties

    @property
    def type(self) -> PacketType:
        return PacketType.SUBACK


class Unsubscribe(Record):
    __match_args__ = ("packet_id", "topic_filters", "properties")
    __slots__ = __match_args__

    def __init__(self, packet_id: int, topic_filters: list[str],
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.topic_filters = topic_filters
        self.properties = {} if properties is None else properties

    @property
    def type(self) -> PacketType:
        return PacketType.UNSUBSCRIBE


class Unsuback(Record):
    """v3.1.1 UNSUBACK has no payload: `reason_codes` is empty when decoded from v3."""

    __match_args__ = ("packet_id", "reason_codes", "properties")
    __slots__ = __match_args__

    def __init__(self, packet_id: int, reason_codes: list[int] | None = None,
                 properties: Properties | None = None) -> None:
        self.packet_id = packet_id
        self.reason_codes = [] if reason_codes is None else reason_codes
        self.properties = {} if properties is None else properties

    @property
    def type(self) -> PacketType:
        return PacketType.UNSUBACK


class Pingreq(Record):
    __slots__ = ()

    @property
    def type(self) -> PacketType:
        return PacketType.PINGREQ


class Pingresp(Record):
    __slots__ = ()

    @property
    def type(self) -> PacketType:
        return PacketType.PINGRESP


class Disconnect(Record):
    __match_args__ = ("reason_code", "properties")
    __slots__ = __match_args__

    def __init__(self, reason_code: int = 0, properties: Properties | None = None) -> None:
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties

    @property
    def type(self) -> PacketType:
        return PacketType.DISCONNECT


class Auth(Record):
    __match_args__ = ("reason_code", "properties")
    __slots__ = __match_args__

    def __init__(self, reason_code: int = 0, properties: Properties | None = None) -> None:
        self.reason_code = reason_code
        self.properties = {} if properties is None else properties

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
