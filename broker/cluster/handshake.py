"""The inter-node handshake: both sides prove they know the cookie without sending it.

Sans-I/O, one object per connection and role. Four messages, JSON (once per connection,
so readability beats size), each one frame on the HANDSHAKE channel:

    dialer   -> hello      {cluster, site, node, host, port, nonce, join, release,
                            cluster_version}
    listener -> challenge  {cluster, site, node, host, port, nonce, proof, release,
                            cluster_version}
    dialer   -> response   {proof}
    listener -> welcome    {}
    either   -> refused    {reason}        (and the connection is closed)

`proof` is HMAC-SHA256(cookie, role || dialer nonce || listener nonce || cluster name), the
role byte differing per direction so one side's proof cannot be replayed as the other's,
and fresh nonces on both sides so a recorded exchange cannot be replayed at all. The
listener proves itself first: a dialer never sends a proof to a node that does not know the
cookie. A different cluster name is refused before any proof: nodes of two clusters never
join, whatever their cookies. A site removed from the cluster (force-leave) is refused until
it dials with `join` set, which only an operator's `broker ctl cluster join` does. A member
that comes back with another data dir than the one its peers knew (a configured site ID on
an empty volume) is refused: it would vote in Raft groups having forgotten its votes and the
entries it acknowledged, which can elect a leader that lacks committed entries.

`v` stays 1, which release 0.1.0 requires; what came later is in added fields, which 0.1.0
ignores: `release` and `cluster_version` (the range of cluster versions the node's code
runs, broker/cluster/versions.py; none from 0.1.0: version 0). A peer whose code cannot run
the cluster's effective version is refused ("too old", "too new"): release 0.1.0 cannot
check this itself, its peers refuse it.
"""

import hmac
import json
import secrets
from collections.abc import Mapping
from enum import Enum
from hashlib import sha256
from typing import Any, NamedTuple

from broker.cluster import versions
from broker.cluster.versions import Speaks

VERSION = 1
REASONS = frozenset({"bad cookie", "cluster name mismatch", "version mismatch", "removed",
                     "not clustering", "malformed", "self", "reborn", versions.TOO_OLD,
                     versions.TOO_NEW})


class Identity(NamedTuple):
    """Who a node is (its site ID, stable across restarts and pod IPs), where it listens, and
    which data dir it runs on (its incarnation: "" from a node that predates it)."""

    site: str
    node: str
    host: str
    port: int
    incarnation: str = ""


class Refused(Exception):
    """The handshake failed; `reason` is what the log and the metric name."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}{': ' + detail if detail else ''}")
        self.reason = reason


class Role(Enum):
    DIALER = "dialer"
    LISTENER = "listener"


class _State(Enum):
    START = 0
    AWAIT_CHALLENGE = 1
    AWAIT_HELLO = 2
    AWAIT_RESPONSE = 3
    AWAIT_WELCOME = 4
    DONE = 5
    FAILED = 6


def _proof(cookie: bytes, role: bytes, dialer_nonce: str, listener_nonce: str,
           cluster: str) -> str:
    message = role + dialer_nonce.encode() + listener_nonce.encode() + cluster.encode()
    return hmac.new(cookie, message, sha256).hexdigest()


def _dump(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _identity(message: dict[str, Any]) -> Identity:
    try:
        identity = Identity(str(message["site"]), str(message["node"]), str(message["host"]),
                            int(message["port"]), str(message.get("incarnation", "")))
    except (KeyError, TypeError, ValueError):
        raise Refused("malformed", "identity fields missing") from None
    if not identity.site or not 0 < identity.port < 65536:
        raise Refused("malformed", "bad site or port")
    return identity


def _other_handshake(message: dict[str, Any]) -> str:
    """Why a peer whose handshake is not version 1 is refused, for the log of the node that
    refuses it: which node and release, and what to run (a later release that dropped
    version 1 cannot join a cluster of this one: roll through a release that speaks both)."""
    spoken, release = message.get("v"), message.get("release")
    who = f"{str(message.get('node'))[:64]}" + (
        f", release {release[:64]}" if isinstance(release, str) else "")
    newer = type(spoken) is int and spoken > VERSION
    return (f"{who} speaks handshake version {str(spoken)[:16]}, this release"
            f" ({versions.MINE.release}) speaks {VERSION}"
            + (": upgrade through a release that speaks both" if newer else ""))


class Handshake:
    """Feed it the peer's handshake payloads; it answers with the payloads to send back
    and, once `done`, names the authenticated peer."""

    def __init__(self, role: Role, me: Identity, cluster: str, cookie: str,
                 refused_sites: frozenset[str] = frozenset(), refuse_all: str = "",
                 incarnations: Mapping[str, str] | None = None,
                 unsettled: frozenset[str] = frozenset(), cluster_version: int = 0,
                 speaks: Speaks = versions.MINE) -> None:
        self.role = role
        self.me = me
        self.cluster = cluster
        self._cookie = cookie.encode()
        self._nonce = secrets.token_hex(16)
        self._peer_nonce = ""
        self._refused_sites = refused_sites
        self._refuse_all = refuse_all
        self._incarnations = incarnations or {}
        self._unsettled = unsettled
        self.join = False  # dialer: an explicit join, readmitting a removed site
        self.readmitted = False  # listener: the peer was removed and joined again
        self._state = _State.START if role is Role.DIALER else _State.AWAIT_HELLO
        self.peer: Identity | None = None
        self._cluster_version = cluster_version  # the effective one, as this node knows it
        self._speaks = speaks
        self.peer_speaks: Speaks | None = None  # the peer's release and cluster versions

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    def start(self) -> bytes:
        """The dialer's first message."""
        assert self._state is _State.START
        self._state = _State.AWAIT_CHALLENGE
        return _dump({"type": "hello", "v": VERSION, "cluster": self.cluster,
                      **self._me(), "nonce": self._nonce, "join": self.join})

    def _me(self) -> dict[str, Any]:
        return {"site": self.me.site, "node": self.me.node, "host": self.me.host,
                "port": self.me.port, "incarnation": self.me.incarnation,
                **versions.announce(self._speaks)}

    def receive(self, payload: bytes) -> list[bytes]:
        """Replies to send, in order. Raises Refused (after which `refusal()` says what to
        tell the peer) when the peer is not one of us or speaks out of turn."""
        try:
            message = json.loads(payload)
            kind = message["type"] if isinstance(message, dict) else None
        except (ValueError, KeyError):
            kind, message = None, {}
        try:
            if kind == "refused":
                # Counted under the peer's reason (a cookie mismatch shows on both nodes), if
                # it is one we know: a metric label must not take any string a peer sends.
                reason = message.get("reason")
                raise Refused(reason if reason in REASONS else "refused", "said the peer")
            handler = {
                _State.AWAIT_HELLO: ("hello", self._on_hello),
                _State.AWAIT_CHALLENGE: ("challenge", self._on_challenge),
                _State.AWAIT_RESPONSE: ("response", self._on_response),
                _State.AWAIT_WELCOME: ("welcome", self._on_welcome),
            }.get(self._state)
            if handler is None or kind != handler[0]:
                raise Refused("malformed", f"unexpected {str(kind)[:32]!r} message")
            return handler[1](message)
        except Refused:
            self._state = _State.FAILED
            raise

    @staticmethod
    def refusal(error: Refused) -> bytes:
        return _dump({"type": "refused", "reason": error.reason})

    def _check_cluster(self, message: dict[str, Any]) -> Identity:
        if message.get("v") != VERSION:
            raise Refused("version mismatch", _other_handshake(message))
        if message.get("cluster") != self.cluster:
            raise Refused("cluster name mismatch",
                          f"peer is in {str(message.get('cluster'))[:64]!r}")
        peer = _identity(message)
        if peer.site == self.me.site:
            raise Refused("self", "a node dialled itself")
        if self._refuse_all:
            raise Refused("not clustering", self._refuse_all)
        speaks = versions.from_handshake(message)
        if speaks is None:
            raise Refused("malformed", "bad release or cluster_version")
        refused = versions.refusal(speaks, self._cluster_version)
        if refused is not None:
            raise Refused(refused[0], f"{refused[1]} ({peer.node}, site {peer.site})")
        known = self._incarnations.get(peer.site, "")
        if known and peer.incarnation and peer.incarnation != known:
            raise Refused("reborn", f"site {peer.site} ({peer.node}) is back without the data"
                          f" dir it had: its Raft votes and logs are gone. Once its old data"
                          f" is known lost, `broker ctl ds forget {peer.site}` on a member,"
                          f" then `broker ctl cluster join` on it")
        if peer.site in self._unsettled:
            # Forgotten, not yet out of every Raft group here: readmitted now it would keep
            # the vote of the data dir it had (perhaps not this one). Once a node that has
            # seen every removal readmits it, the others drop it from `removed` too.
            raise Refused("removed", f"site {peer.site} is still being removed from the"
                          f" Raft groups: retry in a moment")
        if peer.site in self._refused_sites:
            if message.get("join") is not True:
                raise Refused("removed", f"site {peer.site} was removed from the cluster")
            self.readmitted = True
        self.peer_speaks = speaks
        return peer

    def _on_hello(self, message: dict[str, Any]) -> list[bytes]:
        self.peer = self._check_cluster(message)
        self._peer_nonce = str(message.get("nonce", ""))
        if len(self._peer_nonce) < 16:
            raise Refused("malformed", "nonce too short")
        self._state = _State.AWAIT_RESPONSE
        proof = _proof(self._cookie, b"L", self._peer_nonce, self._nonce, self.cluster)
        return [_dump({"type": "challenge", "v": VERSION, "cluster": self.cluster,
                       **self._me(), "nonce": self._nonce, "proof": proof})]

    def _on_challenge(self, message: dict[str, Any]) -> list[bytes]:
        peer = self._check_cluster(message)
        self._peer_nonce = str(message.get("nonce", ""))
        expected = _proof(self._cookie, b"L", self._nonce, self._peer_nonce, self.cluster)
        if len(self._peer_nonce) < 16 or not hmac.compare_digest(
                str(message.get("proof", "")), expected):
            raise Refused("bad cookie", f"from {peer.node}")
        self.peer = peer
        self._state = _State.AWAIT_WELCOME
        proof = _proof(self._cookie, b"D", self._nonce, self._peer_nonce, self.cluster)
        return [_dump({"type": "response", "proof": proof})]

    def _on_response(self, message: dict[str, Any]) -> list[bytes]:
        expected = _proof(self._cookie, b"D", self._peer_nonce, self._nonce, self.cluster)
        if not hmac.compare_digest(str(message.get("proof", "")), expected):
            assert self.peer is not None
            raise Refused("bad cookie", f"from {self.peer.node}")
        self._state = _State.DONE
        return [_dump({"type": "welcome"})]

    def _on_welcome(self, _message: dict[str, Any]) -> list[bytes]:
        self._state = _State.DONE
        return []
