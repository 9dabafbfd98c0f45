"""AUTH from a client, and what a connection's authentication leaves behind: the enhanced
exchange (broker/auth/enhanced.py decides, this sends), the CONNECT waiting for it, and the
timer that ends a connection when its JWT expires."""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.auth.authorization import AclCache
from broker.auth.enhanced import Continue, EnhancedAuth, Failure, Step, Success
from broker.auth.security import Outcome
from broker.mqtt.constants import PropertyId, ReasonCode
from broker.mqtt.errors import ProtocolError
from broker.mqtt.packets import Auth, Connack

if TYPE_CHECKING:
    from broker.server.connection import Connection

log = logging.getLogger(__name__)


class ConnectionAuth:
    """`resume`: what finishes the CONNECT once its exchange succeeds; `connack_data`: the
    exchange's last message, carried by the CONNACK."""

    __slots__ = ("connack_data", "enhanced", "expiry", "resume")

    def __init__(self, enhanced: EnhancedAuth | None) -> None:
        self.enhanced = enhanced
        self.resume: Callable[[], None] | None = None
        self.connack_data: bytes | None = None
        self.expiry: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None


def auth_state(conn: "Connection") -> ConnectionAuth:
    if conn.auth is None:
        conn.auth = ConnectionAuth(None)
    return conn.auth  # type: ignore[no-any-return]


def begin_enhanced(conn: "Connection", enhanced: EnhancedAuth, data: bytes | None,
                   resume: Callable[[], None]) -> None:
    """A CONNECT with an Authentication Method we offer: its first step."""
    state = auth_state(conn)
    state.enhanced, state.resume = enhanced, resume
    _answer(conn, enhanced, enhanced.start(data))


def handle_auth(conn: "Connection", packet: Auth) -> None:
    state = conn.auth
    enhanced = state.enhanced if state is not None else None
    if enhanced is None:
        # MQTT-4.12.0-6 (no Authentication Method in CONNECT, so no AUTH allowed).
        raise ProtocolError("AUTH without an authentication method in CONNECT")
    _answer(conn, enhanced, enhanced.receive(packet.reason_code, packet.properties,
                                             conn.connected))


def _answer(conn: "Connection", enhanced: EnhancedAuth, step: Step) -> None:
    method = enhanced.method
    if isinstance(step, Continue):
        conn.send_packet(Auth(ReasonCode.CONTINUE_AUTHENTICATION, {
            PropertyId.AUTHENTICATION_METHOD: method, PropertyId.AUTHENTICATION_DATA: step.data}))
        return
    security = conn.node.security
    state = auth_state(conn)
    if isinstance(step, Failure):
        security.count_failure(f"scram_{step.reason}")
        log.info("%s of %s from %s failed: %s", method, conn.client_id, conn.peer, step.reason)
        if conn.connected:  # re-authentication (MQTT 5.0 section 4.12.1)
            conn.disconnect(ReasonCode.NOT_AUTHORIZED)
        else:
            conn.send_packet(Connack(False, ReasonCode.BAD_USER_NAME_OR_PASSWORD))
            conn.close()
        return
    assert isinstance(step, Success)
    apply_outcome(conn, Outcome(ReasonCode.SUCCESS, step.superuser))
    if conn.connected:
        conn.send_packet(Auth(ReasonCode.SUCCESS, {
            PropertyId.AUTHENTICATION_METHOD: method, PropertyId.AUTHENTICATION_DATA: step.data}))
        return
    conn.username = step.username
    resume, state.resume, state.connack_data = state.resume, None, step.data
    assert resume is not None
    resume()


def connack_properties(conn: "Connection") -> dict[int, object]:
    """The Authentication Method and the exchange's last data, for the CONNACK."""
    state = conn.auth
    if state is None or state.enhanced is None:
        return {}
    data, state.connack_data = state.connack_data, None
    return {PropertyId.AUTHENTICATION_METHOD: state.enhanced.method,
            PropertyId.AUTHENTICATION_DATA: data or b""}


def apply_outcome(conn: "Connection", outcome: Outcome) -> None:
    """What authentication says about the rest of the connection: a superuser is not asked
    about (no ACL cache at all), rules that came with the credentials join the ACL, and a
    JWT's `exp` ends the connection when it comes."""
    security = conn.node.security
    if outcome.superuser:
        conn.acl_cache = None
    elif outcome.rules is not None:
        conn.acl_cache = AclCache(security.generation, outcome.rules)
    if outcome.expires_at is not None and security.disconnect_after_expire:
        state = auth_state(conn)
        state.cancel()
        loop = asyncio.get_running_loop()
        # `exp` is wall-clock time (seconds since the epoch); the loop's clock is not.
        delay = max(0.0, outcome.expires_at - time.time())
        state.expiry = loop.call_later(delay, _expired, conn)


def _expired(conn: "Connection") -> None:
    if conn.closed:
        return
    conn.node.security.count_failure("jwt_expired_connected")
    log.info("closing %s: its JWT expired", conn.client_id)
    conn.disconnect(ReasonCode.MAXIMUM_CONNECT_TIME)
