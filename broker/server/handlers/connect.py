"""CONNECT: version, client ID, session choice (clean start / expiry), will, limits, CONNACK."""

import asyncio
import logging
from collections.abc import Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from broker.auth.authorization import Verdict
from broker.auth.security import Outcome
from broker.mqtt.constants import MQTT_5, PropertyId, ReasonCode
from broker.mqtt.errors import MQTTError, ProtocolError
from broker.mqtt.packets import Connack, Connect
from broker.mqtt.topic import validate_topic_name
from broker.server.handlers.auth import apply_outcome, begin_enhanced, connack_properties
from broker.server.handlers.authorize import verdict_later, verdict_now
from broker.server.tls import certificate_user
from broker.session.manager import granted_expiry
from broker.session.message import payload_format_ok
from broker.sys_topics import is_sys_topic

if TYPE_CHECKING:
    from broker.server.connection import Connection

log = logging.getLogger(__name__)

P = PropertyId


def _refuse(conn: "Connection", reason: ReasonCode) -> None:
    conn.send_packet(Connack(False, reason))
    conn.close()


def handle_connect(conn: "Connection", packet: Connect) -> None:
    if conn.connected:
        raise ProtocolError("second CONNECT on one connection")
    config = conn.node.config
    version = conn.version = packet.protocol_level
    props = packet.properties
    method = props.get(P.AUTHENTICATION_METHOD)
    enhanced = conn.node.security.enhanced(method) if method is not None else None
    if method is not None and enhanced is None:
        return _refuse(conn, ReasonCode.BAD_AUTHENTICATION_METHOD)

    client_id, assigned = packet.client_id, False
    if not client_id:
        if version != MQTT_5 and not packet.clean_start:
            return _refuse(conn, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)
        import uuid  # here: with `platform` it costs every start-up 4 ms, few clients need it

        client_id, assigned = f"auto-{uuid.uuid4().hex}", True
    if len(client_id) > config["mqtt.max_clientid_len"]:
        return _refuse(conn, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)

    will = packet.will
    if will is not None:
        try:
            validate_topic_name(will.topic)
        except MQTTError:
            return _refuse(conn, ReasonCode.TOPIC_NAME_INVALID)
        if is_sys_topic(will.topic) and not config["sys_topics.allow_client_publish"]:
            return _refuse(conn, ReasonCode.NOT_AUTHORIZED)  # the broker would publish it
        if will.qos > config["mqtt.max_qos_allowed"]:
            return _refuse(conn, ReasonCode.QOS_NOT_SUPPORTED)
        if will.retain and not config["mqtt.retain_available"]:
            return _refuse(conn, ReasonCode.RETAIN_NOT_SUPPORTED)
        if not payload_format_ok(will.payload, will.properties):
            return _refuse(conn, ReasonCode.PAYLOAD_FORMAT_INVALID)

    if version == MQTT_5:
        expiry = props.get(P.SESSION_EXPIRY_INTERVAL, 0)
        conn.send_window = min(props.get(P.RECEIVE_MAXIMUM, 65535), config["mqtt.max_inflight"])
        conn.client_max_packet = props.get(P.MAXIMUM_PACKET_SIZE)
        conn.client_alias_max = props.get(P.TOPIC_ALIAS_MAXIMUM, 0)
    else:
        expiry = 0 if packet.clean_start else int(config["mqtt.session_expiry_interval"])
    granted = granted_expiry(expiry, config["mqtt.max_session_expiry_interval"])
    if granted and conn.node.durable is not None:
        granted = granted_expiry(granted, config["durable_sessions.max_session_expiry_interval"])

    keepalive = packet.keepalive
    server_keepalive = int(config["mqtt.server_keepalive"])
    if server_keepalive:
        keepalive = server_keepalive

    conn.client_id = client_id
    conn.clean_start = packet.clean_start
    conn.will = will
    conn.username = packet.username
    accept = Accept(packet, expiry, granted, keepalive, server_keepalive, assigned)
    if enhanced is not None:
        # The exchange replaces the user name and password (they are not checked): the
        # rest of CONNECT goes on once it succeeds (handlers.auth).
        return begin_enhanced(conn, enhanced, props.get(P.AUTHENTICATION_DATA),
                              lambda: proceed(conn, accept, False))
    authenticate = conn.node.security.checks_credentials
    identity = config["mqtt.peer_cert_as_username"]
    if identity != "disabled":
        certified = certificate_user(conn.transport, identity)
        if certified is not None:  # the verified certificate is the credential
            conn.username, authenticate = certified, False
    proceed(conn, accept, authenticate)


def proceed(conn: "Connection", accept: "Accept", authenticate: bool) -> None:
    """CONNECT once the client is known, or with its credentials still to check."""
    if authenticate:
        security = conn.node.security
        if not security.answers_now:  # the HTTP service is asked in a coroutine
            _hold_for(conn, _accept_later(conn, accept, True))
            return
        packet = accept.packet
        outcome = security.authenticate_now(conn.client_id, packet.username, packet.password,
                                            partial(_checked, conn, accept))
        if outcome is None:
            # The password is checked off the loop: the client's next packets wait, in
            # order, for the CONNACK (`hold_input`) and `_checked` goes on.
            conn.hold_input()
            return
        if not _authenticated(conn, outcome):
            return
    _admit(conn, accept)


def _checked(conn: "Connection", accept: "Accept", outcome: Outcome | BaseException) -> None:
    """The password's answer, in the loop turn that brings it."""
    error = None
    try:
        if isinstance(outcome, BaseException):
            error = outcome
        elif not conn.closed and _authenticated(conn, outcome) and _admit(conn, accept):
            return  # a Task took the hold over
    except Exception as exc:  # the connection ends as on a handler's failure
        error = exc
    conn.release_input(error)


def _authenticated(conn: "Connection", outcome: Outcome) -> bool:
    if outcome.code != ReasonCode.SUCCESS:
        log.info("CONNECT of %s (user %s) from %s refused: %s", conn.client_id,
                 conn.username, conn.peer, outcome.code.name)
        _refuse(conn, outcome.code)
        return False
    apply_outcome(conn, outcome)
    return True


def _local_stamp(conn: "Connection") -> tuple[int, str] | None:
    """The client ID's claim stamp when no other node need be asked (a single node has no
    takeover: its connection's own stamp); None when a claim round is needed."""
    takeover = conn.node.takeover
    return conn.claim_stamp if takeover is None else takeover.local_stamp()


def _admit(conn: "Connection", accept: "Accept") -> bool:
    """The authenticated CONNECT: its will authorized, its client ID claimed, then the
    CONNACK, at once unless other nodes or the HTTP authorization service are to be asked.
    True: a Task goes on, holding the client's next packets (`hold_input`)."""
    stamp = _local_stamp(conn)
    if stamp is None or (will := _will_now(conn)) is None:
        # Other nodes, or the HTTP authorization service, are asked first.
        _hold_for(conn, _accept_later(conn, accept, False))
        return True
    conn.claim_stamp = stamp
    if _will_allowed(conn, will):
        _open(conn, accept)
    return False


def _hold_for(conn: "Connection", rest: Coroutine[Any, Any, None]) -> None:
    conn.hold_input(asyncio.get_running_loop().create_task(rest))


class Accept:
    """What CONNECT decided, carried to the CONNACK across the asynchronous steps. A plain
    class: a dataclass's generated `__init__` would be interpreted (~0.5 us a connection)."""

    __slots__ = ("assigned", "expiry", "granted", "keepalive", "packet", "server_keepalive")

    def __init__(self, packet: Connect, expiry: int, granted: int, keepalive: int,
                 server_keepalive: int, assigned: bool) -> None:
        self.packet = packet
        self.expiry = expiry
        self.granted = granted
        self.keepalive = keepalive
        self.server_keepalive = server_keepalive
        self.assigned = assigned


async def _accept_later(conn: "Connection", accept: Accept, authenticate: bool) -> None:
    packet = accept.packet
    if authenticate:
        verdict = await conn.node.security.authenticate(conn.client_id, packet.username,
                                                        packet.password, lambda: conn.peer)
        if conn.closed or not _authenticated(conn, verdict):
            return
    will = _will_now(conn)
    if will is None:
        assert conn.will is not None
        will = await verdict_later(conn, "publish", conn.will.topic, conn.will.qos,
                                   conn.will.retain)
    if conn.closed or not _will_allowed(conn, will):
        return
    stamp = _local_stamp(conn)
    if stamp is not None:
        conn.claim_stamp = stamp
        return _open(conn, accept)
    takeover = conn.node.takeover
    assert takeover is not None
    outcome = await takeover.claim(conn.client_id, not packet.clean_start)
    conn.claim_stamp = outcome.stamp
    if conn.closed or outcome.refuse is not None:
        if outcome.session is not None:  # moved here for nobody: kept, disconnected
            conn.node.sessions.detach(outcome.session, None)
        if not conn.closed and outcome.refuse is not None:
            properties: dict[int, object] = {}
            if outcome.reference and conn.version == MQTT_5:
                properties[PropertyId.SERVER_REFERENCE] = outcome.reference
            conn.send_packet(Connack(False, outcome.refuse, properties))
            conn.close()
        return
    _open(conn, accept)


def _will_now(conn: "Connection") -> Verdict | None:
    """A will is a PUBLISH made later on the client's behalf: it is authorized now, so a
    client learns at CONNECT rather than never. None: the HTTP service is to be asked."""
    will = conn.will
    if will is None:
        return Verdict.ALLOW
    return verdict_now(conn, "publish", will.topic, will.qos, will.retain)


def _will_allowed(conn: "Connection", verdict: Verdict) -> bool:
    """Refused: 0x87 denied, 0x88 the HTTP service could not be asked or failed."""
    if verdict is Verdict.ALLOW:
        return True
    _refuse(conn, ReasonCode.NOT_AUTHORIZED if verdict is Verdict.DENY
            else ReasonCode.SERVER_UNAVAILABLE)
    return False


def _open(conn: "Connection", accept: Accept) -> None:
    version, client_id, granted = conn.version, conn.client_id, accept.granted
    session, present = conn.node.sessions.open(
        conn, client_id, accept.packet.clean_start, granted
    )
    conn.session = session
    conn.connected = True

    ack = {}
    if version == MQTT_5:
        ack = _connack_properties(conn, accept.assigned, client_id, accept.server_keepalive)
        ack.update(connack_properties(conn))
        if granted != accept.expiry:
            ack[P.SESSION_EXPIRY_INTERVAL] = granted
    conn.send_packet(Connack(present, ReasonCode.SUCCESS, ack))
    conn.start_keepalive(accept.keepalive)
    if present:
        conn.resend_inflight()
        conn.drain()


def _connack_properties(
    conn: "Connection", assigned: bool, client_id: str, server_keepalive: int
) -> dict[int, object]:
    config = conn.node.config
    props: dict[int, object] = {
        P.RECEIVE_MAXIMUM: config["mqtt.max_inflight"],
        P.MAXIMUM_PACKET_SIZE: config["mqtt.max_packet_size"],
        P.RETAIN_AVAILABLE: int(config["mqtt.retain_available"]),
        P.WILDCARD_SUBSCRIPTION_AVAILABLE: int(config["mqtt.wildcard_subscription"]),
        P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 1,
        P.SHARED_SUBSCRIPTION_AVAILABLE: int(config["mqtt.shared_subscription"]),
    }
    if config["mqtt.max_topic_alias"]:
        props[P.TOPIC_ALIAS_MAXIMUM] = config["mqtt.max_topic_alias"]
    if config["mqtt.max_qos_allowed"] < 2:
        props[P.MAXIMUM_QOS] = config["mqtt.max_qos_allowed"]
    if assigned:
        props[P.ASSIGNED_CLIENT_IDENTIFIER] = client_id
    if server_keepalive:
        props[P.SERVER_KEEP_ALIVE] = server_keepalive
    return props

