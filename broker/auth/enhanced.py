"""MQTT 5 enhanced authentication (section 4.12): one connection's exchange as a state
machine. Pure: AUTH contents in, what to answer out; the handlers send the packets.

A CONNECT with an Authentication Method starts it and the server answers AUTH 0x18
(continue) until it sends the CONNACK; after the CONNACK the client may start over with AUTH
0x19 (re-authentication), answered AUTH 0x18 ... then AUTH 0x00. What the protocol forbids
raises ProtocolError (the connection ends with 0x82): an AUTH with another method than the
CONNECT's (MQTT-4.12.0-5, MQTT-4.12.1-1), a re-authentication before the CONNACK or while one
is under way, a continuation with nothing under way, a client's AUTH 0x00. What the
credentials fail is a `Failure`, which the caller answers with a reason code.
"""

from collections.abc import Callable
from typing import NamedTuple

from broker.auth.scram import METHODS, ScramError, ScramServer, parse_client_first
from broker.auth.scram_users import ScramUser
from broker.mqtt.constants import PropertyId, ReasonCode
from broker.mqtt.errors import ProtocolError
from broker.mqtt.packets import Properties


class Continue(NamedTuple):
    data: bytes


class Success(NamedTuple):
    data: bytes
    username: str
    superuser: bool


class Failure(NamedTuple):
    reason: str  # a metric label, e.g. bad_proof, unknown_user, malformed


Step = Continue | Success | Failure
UserLookup = Callable[[str], ScramUser | None]


class EnhancedAuth:
    """The Authentication Method a connection chose and its exchange, if one is under way.
    `lookup` finds a SCRAM user when the exchange needs one (the file may be reloaded
    between a CONNECT and its re-authentication); `mock_key` makes unknown users' salts."""

    __slots__ = ("_algorithm", "_lookup", "_mock_key", "_server", "method", "username")

    def __init__(self, method: str, lookup: UserLookup, mock_key: bytes) -> None:
        self.method = method
        self._algorithm = METHODS[method]
        self._lookup = lookup
        self._mock_key = mock_key
        self._server: ScramServer | None = None
        self.username: str | None = None  # who authenticated last

    @property
    def under_way(self) -> bool:
        return self._server is not None

    def start(self, data: bytes | None) -> Step:
        """CONNECT's Authentication Data (the client-first message)."""
        server = self._server = ScramServer(self._algorithm)
        if data is None:
            return self._fail("malformed")
        try:
            first = parse_client_first(data)
        except ScramError as error:
            return self._fail(error.reason)
        user = self._lookup(first.username)
        credential = user.credentials.get(self._algorithm) if user is not None else None
        return Continue(server.first(first, credential, self._mock_key))

    def receive(self, reason_code: int, properties: Properties, connected: bool) -> Step:
        """An AUTH from the client."""
        method = properties.get(PropertyId.AUTHENTICATION_METHOD)
        if method != self.method:
            raise ProtocolError(f"AUTH with method {method!r}, CONNECT said {self.method!r}")
        data = properties.get(PropertyId.AUTHENTICATION_DATA)
        if reason_code == ReasonCode.RE_AUTHENTICATE:
            if not connected or self._server is not None:
                raise ProtocolError("re-authentication before CONNACK or while one is under"
                                    " way")
            return self.start(data)
        if reason_code != ReasonCode.CONTINUE_AUTHENTICATION:
            raise ProtocolError(f"a client's AUTH with reason code {reason_code:#x}")
        server, self._server = self._server, None
        if server is None:
            raise ProtocolError("AUTH 0x18 with no authentication under way")
        if data is None:
            return Failure("malformed")
        try:
            final = server.final(data)
        except ScramError as error:
            return Failure(error.reason)
        if self.username is not None and server.username != self.username:
            return Failure("other_user")  # a connection keeps the identity it opened with
        user = self._lookup(server.username)
        if user is None:  # deleted between the two messages
            return Failure("unknown_user")
        self.username = user.user_id
        return Success(final, user.user_id, user.is_superuser)

    def _fail(self, reason: str) -> Failure:
        self._server = None
        return Failure(reason)
