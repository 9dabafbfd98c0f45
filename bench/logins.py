"""How a benchmark client logs in (security_bench.py's CONNECT storm): a user name and
password in a 3.1.1 CONNECT, as every broker takes them, or MQTT 5 enhanced authentication
with SCRAM (CONNECT, AUTH 0x18 both ways, CONNACK), which only ours has.

A login is a small state machine the storm's non-blocking sockets drive: `connect` gives the
first bytes to send, `feed` what the broker sent and returns what to send back and whether
the login is over (True accepted, False refused, None not yet). The SCRAM client is the
tests' (written from the RFCs, not from the broker); its salted password is computed once per
user and password, as RFC 5802 lets a client keep it, so the client's PBKDF2 does not
bound the rate measured.
"""

from typing import Protocol

from bench import wire
from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import MQTT_5, PropertyId, ReasonCode
from broker.mqtt.packets import Auth, Connack, Connect
from tests.support.scram_client import ScramClient

CONNACK_OK = b"\x20\x02\x00\x00"
_METHOD, _DATA = PropertyId.AUTHENTICATION_METHOD, PropertyId.AUTHENTICATION_DATA


class Login(Protocol):
    def connect(self) -> bytes: ...

    def feed(self, data: bytes) -> tuple[bytes, bool | None]: ...


class PasswordLogin:
    """3.1.1 CONNECT with a user name and password; accepted: CONNACK return code 0."""

    def __init__(self, client_id: str, credentials: tuple[str, str]) -> None:
        self._packet = wire.connect(client_id, credentials=credentials)
        self._buffer = b""

    def connect(self) -> bytes:
        self._buffer = b""
        return self._packet

    def feed(self, data: bytes) -> tuple[bytes, bool | None]:
        self._buffer += data
        if len(self._buffer) < 4:
            return b"", None
        return b"", self._buffer[:4] == CONNACK_OK


class ScramLogin:
    """MQTT 5 SCRAM-SHA-256 (or -512): accepted once the CONNACK is 0 and carries a
    server-final that proves the broker knew the user's ServerKey."""

    def __init__(self, client_id: str, credentials: tuple[str, str],
                 algorithm: str = "sha256") -> None:
        self._client_id, self._credentials, self._algorithm = client_id, credentials, algorithm
        self._scram = ScramClient(*credentials, algorithm=algorithm)
        self._decoder = Decoder(version=MQTT_5)

    def connect(self) -> bytes:
        self._scram = ScramClient(*self._credentials, algorithm=self._algorithm)  # new nonce
        self._decoder = Decoder(version=MQTT_5)
        return encode(Connect(self._client_id, MQTT_5, True, 0, properties={
            _METHOD: self._scram.method, _DATA: self._scram.first()}), MQTT_5)

    def feed(self, data: bytes) -> tuple[bytes, bool | None]:
        for packet in self._decoder.feed(data):
            if isinstance(packet, Auth) and packet.reason_code == \
                    ReasonCode.CONTINUE_AUTHENTICATION:
                final = self._scram.final(packet.properties.get(_DATA, b""))
                return encode(Auth(ReasonCode.CONTINUE_AUTHENTICATION, {
                    _METHOD: self._scram.method, _DATA: final}), MQTT_5), None
            return b"", (isinstance(packet, Connack) and packet.reason_code == 0
                         and self._scram.verify(packet.properties.get(_DATA, b"")))
        return b"", None
