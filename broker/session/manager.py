"""Owns the sessions of this node: opening, takeover, expiry and delayed wills.

Timers live here (not in Session) so the session stays plain data. A will waits for
min(Will Delay Interval, Session Expiry Interval) after the connection is lost and is
cancelled when the client resumes the session in time (MQTT 5.0 section 3.1.3.2.2).
"""

import asyncio
from collections.abc import Callable
from typing import Any

from broker.mqtt.constants import MAX_UINT32, PropertyId, ReasonCode
from broker.mqtt.packets import Will
from broker.session.message import Message, message_from_publish
from broker.session.session import Session

NEVER_EXPIRES = MAX_UINT32


def granted_expiry(requested: int, cap: float) -> int:
    """The Session Expiry Interval we grant: the client's, bounded by the admin cap if set
    (`mqtt.max_session_expiry_interval`, 0 = no bound)."""
    return min(requested, int(cap)) if cap else requested


class SessionManager:
    def __init__(
        self,
        publish: Callable[[Message], None],
        forget_subscriptions: Callable[[Session], None],
        max_queue: int,
        queue_qos0: bool,
    ) -> None:
        self.sessions: dict[str, Session] = {}
        self._publish = publish
        self._forget_subscriptions = forget_subscriptions
        self._max_queue = max_queue
        self._queue_qos0 = queue_qos0
        self._timers: dict[str, list[asyncio.TimerHandle]] = {}

    def open(self, connection: Any, client_id: str, clean_start: bool, expiry: int) -> tuple[
        Session, bool
    ]:
        """Returns the session for a new connection and whether it was present before."""
        existing = self.sessions.get(client_id)
        if existing is not None and existing.connection is not None:
            existing.connection.take_over(ReasonCode.SESSION_TAKEN_OVER)
            # Taking over may have ended the old session (expiry 0): look it up again.
            existing = self.sessions.get(client_id)
        if existing is not None and clean_start:
            self.end(existing)
            existing = None
        self._cancel_timers(client_id)
        if existing is None:
            session = Session(client_id, expiry, self._max_queue, self._queue_qos0)
            self.sessions[client_id] = session
        else:
            session = existing
            session.expiry_interval = expiry
            session.will = None
        session.connection = connection
        return session, existing is not None

    def detach(self, session: Session, will: Will | None) -> None:
        """The connection is gone: publish or schedule the will, then keep or end the session."""
        session.connection = None
        delay = will.properties.get(PropertyId.WILL_DELAY_INTERVAL, 0) if will else 0
        expiry = session.expiry_interval
        if will is not None and (delay == 0 or expiry == 0):
            self._publish_will(session.client_id, will)
        elif will is not None:
            session.will = will
            self._schedule(session.client_id, min(delay, expiry), self._fire_will, session)
        if expiry == 0:
            self.end(session)
        elif expiry != NEVER_EXPIRES:
            self._schedule(session.client_id, expiry, self.end, session)

    def end(self, session: Session) -> None:
        """The session is over: a pending will goes out now, state is dropped."""
        if self.sessions.get(session.client_id) is not session:
            return
        self._cancel_timers(session.client_id)
        if session.will is not None:
            self._publish_will(session.client_id, session.will)
            session.will = None
        del self.sessions[session.client_id]
        self._forget_subscriptions(session)

    def close_all(self) -> None:
        for client_id in list(self._timers):
            self._cancel_timers(client_id)

    def _fire_will(self, session: Session) -> None:
        if session.will is not None and session.connection is None:
            will, session.will = session.will, None
            self._publish_will(session.client_id, will)

    def _publish_will(self, client_id: str, will: Will) -> None:
        properties = {
            k: v for k, v in will.properties.items() if k != PropertyId.WILL_DELAY_INTERVAL
        }
        self._publish(message_from_publish(
            will.topic, will.payload, will.qos, will.retain, client_id, properties
        ))

    def _schedule(self, client_id: str, delay: float, callback: Callable[[Session], None],
                  session: Session) -> None:
        handle = asyncio.get_running_loop().call_later(delay, callback, session)
        self._timers.setdefault(client_id, []).append(handle)

    def _cancel_timers(self, client_id: str) -> None:
        for handle in self._timers.pop(client_id, ()):
            handle.cancel()
