"""Seeded MQTT client conversations, valid and then broken, for both fuzzers.

A conversation is what one client sends on one connection: CONNECT, then PUBLISH, SUBSCRIBE,
UNSUBSCRIBE, PINGREQ, PUBREL, PUBACK, AUTH and maybe DISCONNECT, in MQTT 3.1, 3.1.1 or 5.0.
Valid packets come from the broker's own encoder, so before mutation they are exactly what
the decoder accepts; the mutations then break them the ways a faulty or hostile client
would: bit flips, truncation, remaining lengths that lie, oversized and non-minimal varints,
duplicated, unknown and out-of-range properties, packets dropped, repeated, reordered, sent
in the other version or in the wrong direction, garbage between packets, and the bytes cut
into TCP writes at random places.

Enhanced authentication (MQTT 5 AUTH, section 4.12) is fuzzed from the start, valid streams
included: a CONNECT may name a method the broker offers (SCRAM-SHA-256/512, when
`authentication.scram.user_file` is set) or one it does not, with a SCRAM client-first
message whole, cut short or garbage; AUTH packets then carry client-final messages (whole
but with a proof that cannot match, the server's nonce being unknown here; cut short;
garbage), re-authentications, reason codes a client may not send, another method or none,
and properties AUTH may not carry. Broken streams may also put an AUTH before the CONNECT.

Conversation N of seed S is drawn from its own `random.Random`, so it is the same bytes on
every run whatever the concurrency did with the others: a finding names (S, N) and
`python -m fuzz.network --seed S --replay N` sends exactly that conversation again.
"""

import base64
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from broker.mqtt.codec import encode, encode_properties, encode_varint
from broker.mqtt.constants import MAX_VARINT, MQTT_3_1, MQTT_3_1_1, MQTT_5
from broker.mqtt.constants import PropertyId as P
from broker.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Publish,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from broker.mqtt.properties import decode_varint
from broker.mqtt.record import replaced

# Topics and filters stay in a small vocabulary so that subscribers and publishers of
# different conversations meet, and retained messages and durable subscriptions stay
# bounded: broker memory that grows with distinct topics is not a leak.
TOPICS: Final = ("fz/a", "fz/b/c", "fz/b/d/e", "fz/\u00e9t\u00e9", "fz/x/y/z/w", "fz/" + "l" * 200)
FILTERS: Final = (
    "fz/#", "fz/+", "fz/b/+/e", "+/+", "#", "fz/a", "fz/b/c", "$share/g1/fz/#",
    "$share/g2/fz/b/+", "$SYS/#", "+/#",
    # refused with a SUBACK failure code, not a disconnect
    "fz/#/a", "fz/a+", "$share/g1", "$share//fz/a", "$share/g+/fz",
)  # fmt: skip
# Client IDs of sessions that outlive their connection (clean start 0, session expiry > 0)
# come from this pool: they resume, take each other over, and their number stays bounded.
PERSISTENT_IDS: Final = 32
# Authentication Methods a CONNECT or AUTH names: the broker's two SCRAM ones, and ones it
# must refuse (0x8C in CONNECT, a protocol error in AUTH). SCRAM user names: one a test may
# create (tests/fuzz/test_network_fuzz.py), one nobody creates, one that needs escaping.
AUTH_METHODS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512", "SCRAM-SHA-1", "PLAIN", "")
SCRAM_USERS: Final = ("fz-scram", "fz-nobody", "fz=2Cx")
MUTATE_RATE: Final = 0.08  # per packet, in a conversation chosen to be broken
BROKEN_SHARE: Final = 0.7  # of conversations


@dataclass(slots=True)
class Conversation:
    index: int
    version: int
    client_id: str
    packets: list[bytes]  # as sent: mutated ones included, garbage glued to the one before
    mutations: list[str]  # "flip@3": what was done to which packet; empty when valid
    writes: list[bytes]  # the same bytes, cut where they go out in separate writes
    intact_connect: bool  # first packet is the CONNECT as generated: answers are parseable

    @property
    def ends(self) -> list[int]:
        """Byte offset where each packet ends: a packet counts as sent once written whole."""
        out, total = [], 0
        for packet in self.packets:
            total += len(packet)
            out.append(total)
        return out


def conversation(seed: int, index: int, broken: bool | None = None) -> Conversation:
    """Conversation `index` of `seed`; `broken` forces a valid (False) or mutated one."""
    rng = random.Random(seed * 1_000_003 + index)
    if broken is None:
        broken = rng.random() < BROKEN_SHARE
    return _Maker(rng, index, broken).build()


def packets_of(seed: int, count: int) -> list[tuple[int, bytes]]:
    """(version, packet) for the valid packets of the first conversations: a seed corpus."""
    out: list[tuple[int, bytes]] = []
    index = 0
    while len(out) < count:
        conv = conversation(seed, index, broken=False)
        out += [(conv.version, packet) for packet in conv.packets]
        index += 1
    return out[:count]


class _Maker:
    """Draws one conversation; holds what later packets depend on (packet IDs, aliases)."""

    def __init__(self, rng: random.Random, index: int, broken: bool) -> None:
        self.rng = rng
        self.index = index
        self.broken = broken
        self.version = rng.choices((MQTT_3_1_1, MQTT_5, MQTT_3_1), (45, 45, 10))[0]
        self.v5 = self.version == MQTT_5
        self.next_id = rng.randrange(1, 0x10000)
        self.aliases: dict[str, int] = {}
        self.session_expiry = 0
        self.auth_method: str | None = None  # the CONNECT's Authentication Method
        self.nonce = ""  # the SCRAM client nonce of the last client-first message
        self.mutations: list[str] = []

    def build(self) -> Conversation:
        rng = self.rng
        connect = self._connect()
        connect_bytes = encode(connect, self.version)
        packets = [self._emit(connect, 0)]
        if self.auth_method is not None and rng.random() < 0.8:  # the exchange's next step
            packets += [self._emit(packet, len(packets)) for packet in self._auth()]
        auth_weight = (8 if self.auth_method is not None else 2) if self.v5 else 0
        ops: list[tuple[Callable[[], list[Packet]], float]] = [
            (self._publish, 55), (self._subscribe, 12), (self._unsubscribe, 7),
            (self._ping, 8), (self._puback, 2), (self._auth, auth_weight),
        ]  # fmt: skip
        makers, weights = zip(*ops, strict=True)
        for _ in range(min(200, int(rng.expovariate(1 / 30)))):
            for packet in rng.choices(makers, weights)[0]():
                packets.append(self._emit(packet, len(packets)))
        if rng.random() < 0.6:
            packets.append(self._emit(self._disconnect(), len(packets)))
        if self.broken and rng.random() < 0.3:
            self._break_stream(packets)
        return Conversation(self.index, self.version, connect.client_id, packets,
                            self.mutations, _writes(rng, b"".join(packets), packets),
                            packets[0] == connect_bytes)

    # ---- valid packets -----------------------------------------------------------------
    def _connect(self) -> Connect:
        rng = self.rng
        persistent = rng.random() < 0.15
        client_id = f"fzp{rng.randrange(PERSISTENT_IDS)}" if persistent else f"fz{self.index}"
        if self.v5 and not persistent and rng.random() < 0.05:
            client_id = ""  # the broker assigns one
        props: Properties = {}
        if self.v5:
            if persistent:
                self.session_expiry = rng.choice((5, 60, 3600, 0xFFFFFFFF))
                props[P.SESSION_EXPIRY_INTERVAL] = self.session_expiry
            self._maybe(props, P.RECEIVE_MAXIMUM, rng.randrange(1, 0x10000))
            self._maybe(props, P.MAXIMUM_PACKET_SIZE, rng.choice((64, 512, 65536, 2**28)))
            self._maybe(props, P.TOPIC_ALIAS_MAXIMUM, rng.randrange(0, 11))
            self._maybe(props, P.REQUEST_PROBLEM_INFORMATION, rng.randrange(2))
            self._maybe(props, P.REQUEST_RESPONSE_INFORMATION, rng.randrange(2))
            self._maybe(props, P.USER_PROPERTY, self._pairs())
            if rng.random() < 0.15:  # enhanced authentication, offered or not
                self.auth_method = rng.choices(AUTH_METHODS, (35, 35, 10, 10, 10))[0]
                props[P.AUTHENTICATION_METHOD] = self.auth_method
                if (first := self._scram_first()) is not None:
                    props[P.AUTHENTICATION_DATA] = first
        will = None
        if rng.random() < 0.2:
            will_props: Properties = {}
            if self.v5:
                self._maybe(will_props, P.WILL_DELAY_INTERVAL, rng.randrange(3))
                self._maybe(will_props, P.MESSAGE_EXPIRY_INTERVAL, rng.randrange(1, 100))
                self._maybe(will_props, P.CONTENT_TYPE, "text/plain")
                self._maybe(will_props, P.USER_PROPERTY, self._pairs())
            will = Will(rng.choice(TOPICS), self._payload()[:0xFFFF], rng.randrange(3),
                        rng.random() < 0.2, will_props)
        username = rng.choice((None, None, "user", "\u00fcser"))
        password = None
        if (username or self.v5) and rng.random() < 0.5:  # v3 needs a user name for it
            password = rng.randbytes(rng.randrange(9))
        return Connect(client_id, self.version, not persistent, rng.choice((0, 10, 60, 65535)),
                       username, password, will, props)

    def _publish(self) -> list[Packet]:
        rng = self.rng
        topic = rng.choice(TOPICS)
        qos = rng.choices((0, 1, 2), (40, 40, 20))[0]
        props: Properties = {}
        payload = self._payload()
        if self.v5:
            if rng.random() < 0.1:  # UTF-8, or now and then not although it says so (0x99)
                props[P.PAYLOAD_FORMAT_INDICATOR] = 1
                if rng.random() < 0.9:
                    payload = payload.decode(errors="replace").encode()
            self._maybe(props, P.MESSAGE_EXPIRY_INTERVAL, rng.randrange(0, 100_000))
            self._maybe(props, P.CONTENT_TYPE, "application/json")
            self._maybe(props, P.RESPONSE_TOPIC, rng.choice(TOPICS))
            self._maybe(props, P.CORRELATION_DATA, rng.randbytes(rng.randrange(17)))
            self._maybe(props, P.USER_PROPERTY, self._pairs())
            if rng.random() < 0.2:
                alias = self.aliases.get(topic)
                if alias is None:
                    alias = self.aliases[topic] = len(self.aliases) + 1
                elif rng.random() < 0.7:
                    topic = ""
                props[P.TOPIC_ALIAS] = alias
        packet_id = self._packet_id() if qos else None
        dup = bool(qos) and rng.random() < 0.05
        out: list[Packet] = [Publish(topic, payload, qos, rng.random() < 0.05, dup, packet_id,
                                     props)]
        if qos == 2 and packet_id is not None and rng.random() < 0.8:
            out.append(Pubrel(packet_id))
        return out

    def _subscribe(self) -> list[Packet]:
        rng = self.rng
        subs = [
            Subscription(rng.choice(FILTERS), rng.randrange(3),
                         *((rng.random() < 0.2, rng.random() < 0.2, rng.randrange(3))
                           if self.v5 else ()))
            for _ in range(rng.randrange(1, 5))
        ]
        props: Properties = {}
        if self.v5:
            self._maybe(props, P.SUBSCRIPTION_IDENTIFIER, [rng.randrange(1, MAX_VARINT + 1)])
            self._maybe(props, P.USER_PROPERTY, self._pairs())
        return [Subscribe(self._packet_id(), subs, props)]

    def _unsubscribe(self) -> list[Packet]:
        rng = self.rng
        props: Properties = {}
        if self.v5:
            self._maybe(props, P.USER_PROPERTY, self._pairs())
        filters = [rng.choice(FILTERS) for _ in range(rng.randrange(1, 4))]
        return [Unsubscribe(self._packet_id(), filters, props)]

    def _ping(self) -> list[Packet]:
        return [Pingreq()]

    def _puback(self) -> list[Packet]:
        """An acknowledgement for a delivery that may never have been sent."""
        return [Puback(self.rng.randrange(1, 8))]

    def _auth(self) -> list[Packet]:
        """An AUTH: mostly the exchange's next step as a client would send it, else one the
        protocol forbids (a reason code a client may not send, another method or none, a
        property AUTH may not carry). Without an exchange under way, or when enhanced
        authentication is off, the broker must end the connection, nothing else."""
        rng = self.rng
        reason = rng.choices((0x18, 0x19, 0x00, rng.randrange(256)), (55, 25, 10, 10))[0]
        props: Properties = {}
        if rng.random() < 0.92:
            own = self.auth_method is not None and rng.random() < 0.85
            props[P.AUTHENTICATION_METHOD] = self.auth_method if own else rng.choice(AUTH_METHODS)
        data = self._scram_first() if reason == 0x19 else self._scram_final()
        if data is not None:
            props[P.AUTHENTICATION_DATA] = data
        self._maybe(props, P.REASON_STRING, "fz")
        self._maybe(props, P.USER_PROPERTY, self._pairs())
        if rng.random() < 0.05:  # not an AUTH property (3.15.2.2)
            pid, value = rng.choice(((P.TOPIC_ALIAS, 1), (P.CONTENT_TYPE, "x"),
                                     (P.SESSION_EXPIRY_INTERVAL, 60)))
            props[pid] = value
        return [Auth(reason, props)]

    def _scram_first(self) -> bytes | None:
        """A SCRAM client-first message (RFC 5802 section 7): whole, with channel binding
        the broker does not offer, cut short, garbage, or missing."""
        rng = self.rng
        self.nonce = rng.randbytes(rng.randrange(1, 24)).hex()
        user = rng.choice(SCRAM_USERS)
        whole = f"n,,n={user},r={self.nonce}".encode()
        how = rng.choices(("whole", "binding", "cut", "garbage", "none"), (60, 5, 15, 10, 10))[0]
        if how == "binding":
            return b"p=tls-unique," + whole[2:]
        return self._cut_or_garbage(how, whole)

    def _scram_final(self) -> bytes | None:
        """A SCRAM client-final message: its nonce extends the client's own (the server's
        part is unknown before the conversation is played), its proof is random bytes of
        SHA-256's size; or it is cut short, garbage, or missing."""
        rng = self.rng
        nonce = self.nonce + rng.randbytes(rng.randrange(0, 24)).hex()
        proof = base64.b64encode(rng.randbytes(rng.choice((32, 64, 3)))).decode()
        whole = f"c={rng.choice(('biws', 'eSws', ''))},r={nonce},p={proof}".encode()
        how = rng.choices(("whole", "cut", "garbage", "none"), (60, 20, 10, 10))[0]
        return self._cut_or_garbage(how, whole)

    def _cut_or_garbage(self, how: str, whole: bytes) -> bytes | None:
        rng = self.rng
        if how == "cut":
            return whole[: rng.randrange(len(whole))]
        if how == "garbage":
            return rng.randbytes(rng.randrange(0, 300))
        return None if how == "none" else whole

    def _disconnect(self) -> Disconnect:
        rng = self.rng
        props: Properties = {}
        if self.v5:
            if self.session_expiry and rng.random() < 0.3:
                props[P.SESSION_EXPIRY_INTERVAL] = rng.choice((0, 1, 60))
            self._maybe(props, P.REASON_STRING, "bye")
        return Disconnect(rng.choice((0x00, 0x04)) if self.v5 else 0, props)

    def _packet_id(self) -> int:
        self.next_id = self.next_id % 0xFFFF + 1
        return self.next_id

    def _payload(self) -> bytes:
        rng = self.rng
        size = rng.choices((rng.randrange(0, 64), rng.randrange(64, 2048),
                            rng.randrange(2048, 70_000)), (89, 10, 1))[0]
        return rng.randbytes(size)

    def _pairs(self) -> list[tuple[str, str]]:
        rng = self.rng
        return [(rng.choice(("k", "key", "\u00e9")), rng.choice(("v", "", "x" * 40)))
                for _ in range(rng.randrange(1, 4))]

    def _maybe(self, props: Properties, pid: int, value: object) -> None:
        if self.rng.random() < 0.25:
            props[pid] = value

    # ---- breaking them -----------------------------------------------------------------
    def _emit(self, packet: Packet, position: int) -> bytes:
        """The packet's bytes: as encoded, or (in a broken conversation, now and then) with
        its property block or its bytes broken."""
        rng = self.rng
        if not self.broken or rng.random() >= MUTATE_RATE:
            return encode(packet, self.version)
        props = getattr(packet, "properties", None)
        if self.v5 and props and rng.random() < 0.4:
            block, what = _break_properties(rng, props)
            self.mutations.append(f"{what}@{position}")
            return _with_property_block(packet, block)
        data, what = _break_bytes(rng, encode(packet, self.version))
        self.mutations.append(f"{what}@{position}")
        return data

    def _break_stream(self, packets: list[bytes]) -> None:
        """Packets dropped, repeated, swapped, garbage between them, a packet of the other
        version, one that only a server sends, or an AUTH (v5's encoding, whatever the
        conversation's version) anywhere, before the CONNECT half of the time."""
        rng = self.rng
        i = rng.randrange(len(packets))
        what = rng.choice(("drop", "dup", "swap", "garbage", "cross", "server", "auth"))
        if what == "drop" and len(packets) > 1:
            del packets[i]
        elif what == "dup":
            packets.insert(i, packets[i])
        elif what == "swap" and i + 1 < len(packets):
            packets[i], packets[i + 1] = packets[i + 1], packets[i]
        elif what == "garbage":
            packets[i] += rng.randbytes(rng.randrange(1, 64))
        elif what == "auth":
            i = 0 if rng.random() < 0.5 else i
            packets.insert(i, encode(self._auth()[0], MQTT_5))
        elif what == "cross":
            other = MQTT_5 if self.version != MQTT_5 else MQTT_3_1_1
            saved, self.version, self.v5 = self.version, other, other == MQTT_5
            packet = rng.choice(self._publish() + self._subscribe() + self._unsubscribe())
            packets.insert(i, encode(packet, other))
            self.version, self.v5 = saved, saved == MQTT_5
        else:
            what = "server"
            packet = rng.choice((Connack(False, 0), Suback(1, [0]), Unsuback(1), Pingresp()))
            packets.insert(i, encode(packet, self.version))
        self.mutations.append(f"{what}@{i}")


def _entries(props: Properties) -> list[bytes]:
    """The property block's entries one by one (each user property and subscription
    identifier on its own), so that they can be repeated, reordered or corrupted."""
    out: list[bytes] = []
    for pid, value in props.items():
        values = value if isinstance(value, list) else [value]
        for one in values:
            block = encode_properties({pid: [one] if isinstance(value, list) else one})
            _, start = decode_varint(block, 0, len(block))
            out.append(block[start:])
    return out


# Entries that are wrong whatever the packet: unknown identifiers, values the spec forbids,
# bad UTF-8, a 5-byte varint.
_BAD_ENTRIES: Final = (
    b"\x00", b"\x7f\x00", b"\xff", b"\x04\x00",
    b"\x21\x00\x00",  # Receive Maximum 0
    b"\x23\x00\x00",  # Topic Alias 0
    b"\x27\x00\x00\x00\x00",  # Maximum Packet Size 0
    b"\x01\x02",  # Payload Format Indicator 2
    b"\x0b\x00",  # Subscription Identifier 0
    b"\x0b\xff\xff\xff\xff\x01",  # Subscription Identifier in 5 bytes
    b"\x0b\x80\x00",  # non-minimal varint
    b"\x03\x00\x02\xff\xfe",  # Content Type, invalid UTF-8
    b"\x03\x00\x01\x00",  # Content Type, U+0000
    b"\x26\x00\x05ab",  # User Property, name longer than the block
    b"\x13\x00\x05",  # Server Keep Alive: a CONNACK property
)  # fmt: skip


def _break_properties(rng: random.Random, props: Properties) -> tuple[bytes, str]:
    """A broken property block (its length prefix included) for `props`."""
    entries = _entries(props)
    what = rng.choice(("prop-dup", "prop-bad", "prop-len", "prop-varint", "prop-order"))
    if what == "prop-dup":
        entries.insert(rng.randrange(len(entries) + 1), rng.choice(entries))
    elif what == "prop-bad":
        entries.insert(rng.randrange(len(entries) + 1), rng.choice(_BAD_ENTRIES))
    elif what == "prop-order":
        rng.shuffle(entries)
    body = b"".join(entries)
    if what == "prop-len":
        lie = rng.choice((len(body) + rng.choice((-2, -1, 1, 2, 100)), MAX_VARINT))
        return encode_varint(max(0, lie)) + body, what
    if what == "prop-varint":
        return rng.choice((_non_minimal(len(body)), b"\x80\x80\x80\x80\x01")) + body, what
    return encode_varint(len(body)) + body, what


# A property block no generated packet has before its own: `_with_property_block` finds
# where the block goes by encoding the packet with this one.
_MARK: Final[Properties] = {P.USER_PROPERTY: [("\x01", "")]}
_MARK_BLOCK: Final = encode_properties(_MARK)


def _with_property_block(packet: Packet, block: bytes) -> bytes:
    """`packet` (v5) encoded with `block` as its property block. The encoder would not
    write a broken block, and leaves out an empty one (DISCONNECT, AUTH): so the packet is
    encoded with a marker block, which is then replaced."""
    marked = encode(replaced(packet, properties=_MARK), MQTT_5)
    _, start = decode_varint(marked, 1, len(marked))
    at = marked.index(_MARK_BLOCK, start)
    body = marked[start:at] + block + marked[at + len(_MARK_BLOCK) :]
    return marked[:1] + encode_varint(len(body)) + body


def _non_minimal(value: int) -> bytes:
    """`value` as a varint with a needless trailing continuation (1.5.5 forbids it)."""
    minimal = bytearray(encode_varint(value))
    if len(minimal) == 4:
        return bytes(minimal) + b"\x00"  # five bytes: too long as well
    minimal[-1] |= 0x80
    return bytes(minimal) + b"\x00"


def _break_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """One packet's bytes broken: bits, a byte, its type, its length or its end."""
    buf = bytearray(data)
    _, start = decode_varint(data, 1, len(data))
    body = data[start:]
    what = rng.choice(("flip", "byte", "type", "truncate", "grow", "length", "varint", "huge"))
    if what == "flip":
        for _ in range(rng.randrange(1, 4)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif what == "byte":
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif what == "type":
        buf[0] = rng.randrange(256)
    elif what == "truncate":
        del buf[rng.randrange(1, len(buf)) :]
    elif what == "grow":
        at = rng.randrange(len(buf) + 1)
        buf[at:at] = rng.randbytes(rng.randrange(1, 9))
    elif what == "length":  # the remaining length lies, the body is as it was
        lie = max(0, len(body) + rng.choice((-3, -2, -1, 1, 2, 3, 1000, -len(body))))
        return data[:1] + encode_varint(lie) + body, what
    elif what == "varint":
        return data[:1] + _non_minimal(len(body)) + body, what
    else:  # the largest remaining length there is, or a varint that never ends
        return data[:1] + rng.choice((b"\xff\xff\xff\x7f", b"\xff\xff\xff\xff\x01")) + body, what
    return bytes(buf), what


def _writes(rng: random.Random, data: bytes, packets: list[bytes]) -> list[bytes]:
    """`data` cut into the pieces it is written in: whole, packet by packet, at random
    places, or its first bytes one at a time (a packet header split across reads)."""
    how = rng.choices(("whole", "packets", "random", "dribble"), (30, 30, 30, 10))[0]
    if how == "whole" or len(data) < 2:
        return [data]
    if how == "packets":
        return packets
    if how == "random":
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(1, 9))))
        return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    head = min(len(data), rng.randrange(2, 40))
    return [data[i : i + 1] for i in range(head)] + ([data[head:]] if head < len(data) else [])
