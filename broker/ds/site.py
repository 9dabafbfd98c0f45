"""This node's site ID: its identity in Durable Storage, independent of host or pod name.

Random at first start and kept in the data dir, so a pod that comes back on the same volume
is the same site. A configured `node.site_id` is taken at first start; later it must agree
with the stored one (without regard to case: hexadecimal IDs were once written in upper
case), because replicas are placed on sites and a silently changed identity would make this
node's data look like someone else's. The stored spelling is the one used.

The incarnation names the data dir itself: random, made with it. A configured site ID
survives the loss of its volume (the operator gives each pod ordinal the same one), so the
site alone cannot tell a node that kept its Raft logs and votes from one that came back
empty; its peers tell them apart by the incarnation (cluster/handshake.py).
"""

import secrets
from pathlib import Path

from broker.ds.files import write_atomically

FILE = "site_id"
INCARNATION_FILE = "incarnation"


class SiteIdMismatch(ValueError):
    pass


def _read(root: Path, name: str) -> str | None:
    try:
        return (root / name).read_text().strip() or None
    except FileNotFoundError:
        return None


def _store(root: Path, name: str, value: str) -> str:
    root.mkdir(parents=True, exist_ok=True)
    write_atomically(root / name, value.encode() + b"\n")
    return value


def read_site_id(root: Path) -> str | None:
    return _read(root, FILE)


def ensure_site_id(root: Path, configured: str) -> str:
    stored = read_site_id(root)
    if stored is not None:
        if configured and configured.lower() != stored.lower():
            raise SiteIdMismatch(
                f"node.site_id {configured!r} contradicts the site ID {stored!r} stored in"
                f" {root / FILE}; keep the stored one or use another data dir"
            )
        return stored
    return _store(root, FILE, configured or secrets.token_hex(8))


def ensure_incarnation(root: Path) -> str:
    return _read(root, INCARNATION_FILE) or _store(root, INCARNATION_FILE,
                                                   secrets.token_hex(8))
