"""Who may change a durable session in the replicated `sessions` database (builtin_raft).

A session has one owner, the node that serves it, named in its meta with an epoch that
grows each time the session moves. The node that takes a session over writes a claim
first: the meta with its own site and the next epoch. Once a claim is applied, every
replica refuses the writes of the node that held the session before, so a node that was
frozen or cut off while its session moved cannot, when it comes back, overwrite what the
new owner did since (read positions, acknowledgements, QoS 2 state): the claim is the
fencing token of a lease, checked where the writes land, in the log's order.

For a command from node W, per session (a meta with no site predates builtin_raft and
belongs to whoever writes it):

- meta written: admitted if none is stored, if its epoch is above the stored one's (a
  claim), or if it keeps the stored epoch and the stored meta names W;
- meta deleted (the session ends): admitted if the stored meta names W;
- any other key of the session: admitted if W owns the session before the command, or
  after the command's admitted meta write. Keys of no session (heartbeats) are admitted.
"""

from collections.abc import Callable

from broker.session.durable import records as r

Write = tuple[bytes, bytes | None]
Owner = tuple[str, int]  # site, epoch
_SESSION_KINDS = frozenset((b"m", b"s", b"p", b"b", b"k", b"r", b"a"))


def admitted(writer: str, writes: list[Write],
             stored: Callable[[bytes], bytes | None]) -> list[Write]:
    before: dict[str, Owner | None] = {}
    after: dict[str, Owner | None] = {}
    refused: set[bytes] = set()
    for key, value in writes:
        kind, client_id = r.split_key(key)
        if kind != b"m":
            continue
        current = _owner(stored(key))
        before[client_id] = after[client_id] = current
        if _meta_admitted(writer, current, None if value is None else _owner(value)):
            after[client_id] = None if value is None else _owner(value)
        else:
            refused.add(key)
    result = []
    for key, value in writes:
        kind, client_id = r.split_key(key)
        if kind == b"m":
            if key not in refused:
                result.append((key, value))
            continue
        if kind not in _SESSION_KINDS:
            result.append((key, value))
            continue
        if client_id not in before:
            before[client_id] = after[client_id] = _owner(stored(r.meta_key(client_id)))
        if _owns(writer, before[client_id]) or _owns(writer, after[client_id]):
            result.append((key, value))
    return result


def _owner(raw: bytes | None) -> Owner | None:
    if raw is None:
        return None
    meta = r.Meta.from_bytes(raw)
    return meta.site, meta.epoch


def _owns(writer: str, owner: Owner | None) -> bool:
    return owner is not None and owner[0] in ("", writer)


def _meta_admitted(writer: str, current: Owner | None, new: Owner | None) -> bool:
    if current is None:
        return True
    if new is None:
        return _owns(writer, current)
    return new[1] > current[1] or (new[1] == current[1] and _owns(writer, current))
