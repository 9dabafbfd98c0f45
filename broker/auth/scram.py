"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server's side. Pure: messages
in, messages out, no I/O.

    client-first  n,,n=USER,r=CNONCE
    server-first  r=CNONCE SNONCE,s=base64(SALT),i=ITERATIONS
    client-final  c=biws,r=CNONCE SNONCE,p=base64(ClientKey XOR HMAC(StoredKey, AuthMessage))
    server-final  v=base64(HMAC(ServerKey, AuthMessage))

A user is stored as EMQX's SCRAM database stores one: a salt, StoredKey = H(ClientKey) and
ServerKey, never the password or SaltedPassword. Checking a proof costs two HMACs, so an
exchange runs on the event loop; the slow PBKDF2 is paid once, when the user is made.

Channel binding is not offered (a `p=` client is refused), and user names are compared as
sent (UTF-8, no SASLprep), as EMQX does. An unknown user gets a salt derived from its name
(RFC 5802 section 5.1): it fails at the proof like a wrong password, so the exchange does
not tell which user names exist.
"""

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Final, NamedTuple

# MQTT Authentication Method -> hashlib name (RFC 7677 and its SHA-512 sibling).
METHODS: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
DEFAULT_ITERATIONS: Final = 4096  # RFC 7677's minimum, EMQX's default
MAX_ITERATIONS: Final = 1_000_000
_SALT_BYTES: Final = 16
_MAX_MESSAGE: Final = 4096  # a client-first or client-final longer than this is not SCRAM


class ScramError(ValueError):
    """The exchange failed; `reason` is a metric label (never the proof or password)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class Credential(NamedTuple):
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def make_credential(password: bytes, algorithm: str, iterations: int = DEFAULT_ITERATIONS,
                    salt: bytes | None = None) -> Credential:
    """Slow by design (PBKDF2): run it off the event loop."""
    salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    salted = hashlib.pbkdf2_hmac(algorithm, password, salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", algorithm)
    return Credential(salt, iterations, hashlib.new(algorithm, client_key).digest(),
                      hmac.digest(salted, b"Server Key", algorithm))


class ClientFirst(NamedTuple):
    gs2_header: str
    bare: str
    username: str
    nonce: str


def parse_client_first(message: bytes) -> ClientFirst:
    text = _text(message)
    cbind, comma, rest = text.partition(",")
    if not comma:
        raise ScramError("client-first has no GS2 header", "malformed")
    if cbind.startswith("p="):
        raise ScramError("channel binding is not supported", "channel_binding")
    if cbind not in ("n", "y"):
        raise ScramError(f"bad channel-binding flag {cbind[:8]!r}", "malformed")
    authzid, comma, bare = rest.partition(",")
    if not comma:
        raise ScramError("client-first has no GS2 header", "malformed")
    if authzid:
        raise ScramError("an authorization identity is not supported", "authzid")
    attributes = _attributes(bare)
    if len(attributes) < 2 or attributes[0][0] != "n" or attributes[1][0] != "r":
        raise ScramError("client-first must start n=USER,r=NONCE", "malformed")
    username = _saslname(attributes[0][1])
    nonce = attributes[1][1]
    _check_nonce(nonce)
    return ClientFirst(f"{cbind},{authzid},", bare, username, nonce)


class ScramServer:
    """One exchange: `first` answers the client-first, `final` checks the client's proof
    and answers the server-final (or raises ScramError)."""

    __slots__ = ("_algorithm", "_auth_prefix", "_credential", "_gs2_header", "_known",
                 "_nonce", "username")

    def __init__(self, algorithm: str) -> None:
        self._algorithm = algorithm
        self.username = ""
        self._credential: Credential | None = None
        self._known = False
        self._nonce = self._gs2_header = self._auth_prefix = ""

    def first(self, client_first: ClientFirst, credential: Credential | None,
              mock_key: bytes, server_nonce: str | None = None) -> bytes:
        """`credential` None: an unknown user, answered with a salt made from `mock_key`
        and its name, so that it looks like any other."""
        self.username = client_first.username
        self._known = credential is not None
        if credential is None:
            seed = hmac.digest(mock_key, client_first.username.encode(), "sha256")
            credential = Credential(seed[:_SALT_BYTES], DEFAULT_ITERATIONS, seed, seed)
        self._credential = credential
        self._gs2_header = client_first.gs2_header
        self._nonce = client_first.nonce + (server_nonce or secrets.token_urlsafe(18))
        server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                        f"i={credential.iterations}")
        self._auth_prefix = f"{client_first.bare},{server_first},"
        return server_first.encode()

    def final(self, message: bytes) -> bytes:
        credential = self._credential
        if credential is None:
            raise ScramError("client-final before client-first", "malformed")
        self._credential = None  # one proof per exchange
        text = _text(message)
        without_proof, comma, proof_attribute = text.rpartition(",")
        attributes = _attributes(without_proof) if comma else []
        if (len(attributes) < 2 or attributes[0][0] != "c" or attributes[1][0] != "r"
                or not proof_attribute.startswith("p=")):
            raise ScramError("client-final must be c=...,r=...,p=...", "malformed")
        if _b64(attributes[0][1]) != self._gs2_header.encode():
            raise ScramError("channel binding data differs from the client-first's",
                             "malformed")
        if attributes[1][1] != self._nonce:
            raise ScramError("the nonce differs from the server-first's", "bad_nonce")
        proof = _b64(proof_attribute[2:])
        algorithm = self._algorithm
        auth_message = (self._auth_prefix + without_proof).encode()
        signature = hmac.digest(credential.stored_key, auth_message, algorithm)
        if len(proof) != len(signature):
            raise ScramError("the proof has the wrong length", "bad_proof")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        computed = hashlib.new(algorithm, client_key).digest()
        if not hmac.compare_digest(computed, credential.stored_key) or not self._known:
            raise ScramError("wrong proof", "bad_proof" if self._known else "unknown_user")
        server_signature = hmac.digest(credential.server_key, auth_message, algorithm)
        return b"v=" + base64.b64encode(server_signature)


def _text(message: bytes) -> str:
    if len(message) > _MAX_MESSAGE:
        raise ScramError(f"a SCRAM message of {len(message)} bytes", "malformed")
    try:
        return message.decode()
    except UnicodeDecodeError:
        raise ScramError("a SCRAM message is not UTF-8", "malformed") from None


def _attributes(text: str) -> list[tuple[str, str]]:
    """`a=value` pairs in order; RFC 5802's reserved `m=` (a mandatory extension we do not
    know) fails the exchange, as the RFC asks."""
    pairs = []
    for part in text.split(","):
        name, equals, value = part.partition("=")
        if len(name) != 1 or not equals or not name.isalpha():
            raise ScramError(f"bad SCRAM attribute {part[:16]!r}", "malformed")
        if name == "m":
            raise ScramError("mandatory extension not supported", "malformed")
        pairs.append((name, value))
    return pairs


def _saslname(value: str) -> str:
    if not value:
        raise ScramError("empty user name", "malformed")
    parts = value.split("=")
    out = [parts[0]]
    for part in parts[1:]:
        escape, rest = part[:2], part[2:]
        if escape not in ("2C", "3D"):
            raise ScramError("bad escape in the user name", "malformed")
        out.append(("," if escape == "2C" else "=") + rest)
    return "".join(out)


def _check_nonce(nonce: str) -> None:
    if not nonce or any(not 0x21 <= ord(c) <= 0x7E or c == "," for c in nonce):
        raise ScramError("the client nonce is empty or not printable", "malformed")


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramError("bad base64 in a SCRAM message", "malformed") from None
