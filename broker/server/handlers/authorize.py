"""Whether a connection may publish, subscribe or leave a will, when the answer may take a
round trip to the HTTP authorization service (`authorization.http`).

The rules that came with the credentials and the cache answer at once (`verdict_now`);
otherwise the caller asks in a task (`verdict_later`) and holds the client's later packets
meanwhile (`Connection.hold_input`), so its packets stay in order, only it waits, and the
event loop never does. Without the service every answer is immediate, as before.
"""

from typing import TYPE_CHECKING

from broker.auth.acl import Access
from broker.auth.authorization import Verdict

if TYPE_CHECKING:
    from broker.server.connection import Connection


def verdict_now(conn: "Connection", action: str, topic: str, qos: int,
                retain: bool) -> Verdict | None:
    """`action`: "publish" or "subscribe". None: the service is to be asked."""
    cache = conn.acl_cache
    if cache is None:  # a superuser, or nothing to ask
        return Verdict.ALLOW
    security = conn.node.security
    if security.http_authz is None:
        access = Access.WRITE if action == "publish" else Access.READ
        return Verdict.ALLOW if conn.authorized(topic, access) else Verdict.DENY
    return security.authorize_now(cache, action, topic, qos, retain)


async def verdict_later(conn: "Connection", action: str, topic: str, qos: int,
                        retain: bool) -> Verdict:
    """The service's chain, for what `verdict_now` left open."""
    cache = conn.acl_cache
    assert cache is not None
    return await conn.node.security.authorize(cache, conn.client_id, conn.username, conn.peer,
                                              action, topic, qos, retain)
