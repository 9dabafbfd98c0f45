"""Mosquitto's password file, read and written. Pure.

    file   := line*
    line   := USERNAME ":" hash | "#" comment | blank
    hash   := "$7$" iterations "$" base64(salt) "$" base64(PBKDF2-HMAC-SHA512(password, salt))
            | "$6$" base64(salt) "$" base64(SHA-512(password || salt))

`mosquitto_passwd` (2.0 writes `$7$` with 101 iterations and a 12-byte salt; 1.6 wrote
`$6$`) and a Kubernetes Secret mounted as a file are both ways to make one, so the format is
Mosquitto's rather than ours. The user name is everything before the first colon; a
password may contain colons. A line that cannot be understood names the file and line and
fails the whole file: a half-read file would lock out the users after the bad line.
"""

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Final, NamedTuple

PBKDF2_ITERATIONS: Final = 101  # mosquitto_passwd's default
_SALT_BYTES: Final = 12
_MAX_ITERATIONS: Final = 10_000_000


class PasswordFileError(ValueError):
    pass


class UnsupportedHash(PasswordFileError):
    """A hash this broker cannot check: that user is refused, the rest of the file stands."""


class Hash(NamedTuple):
    """(A NamedTuple: a frozen dataclass costs a start ~0.7 ms to build, issue 42.)"""

    iterations: int  # 0: the old salted SHA-512
    salt: bytes
    digest: bytes

    def matches(self, password: bytes) -> bool:
        """Constant-time; slow by design for `$7$` (run it off the event loop)."""
        if self.iterations:
            computed = hashlib.pbkdf2_hmac("sha512", password, self.salt, self.iterations,
                                           len(self.digest))
        else:
            computed = hashlib.sha512(password + self.salt).digest()
        return hmac.compare_digest(computed, self.digest)

    def __str__(self) -> str:
        salt, digest = base64.b64encode(self.salt).decode(), base64.b64encode(self.digest).decode()
        if self.iterations:
            return f"$7${self.iterations}${salt}${digest}"
        return f"$6${salt}${digest}"


def make_hash(password: bytes, iterations: int = PBKDF2_ITERATIONS) -> Hash:
    salt = secrets.token_bytes(_SALT_BYTES)
    return Hash(iterations, salt, hashlib.pbkdf2_hmac("sha512", password, salt, iterations, 64))


def parse_hash(text: str) -> Hash:
    parts = text.split("$")
    try:
        if len(parts) == 5 and parts[0] == "" and parts[1] == "7":
            iterations = int(parts[2])
            if not 0 < iterations <= _MAX_ITERATIONS:
                raise PasswordFileError(f"iterations {iterations} out of range")
            return Hash(iterations, _b64(parts[3]), _b64(parts[4]))
        if len(parts) == 4 and parts[0] == "" and parts[1] == "6":
            return Hash(0, _b64(parts[2]), _b64(parts[3]))
    except (ValueError, binascii.Error) as error:
        raise PasswordFileError(f"malformed hash: {error}") from None
    if len(parts) > 1 and parts[0] == "":
        raise UnsupportedHash(f"unsupported hash format ${parts[1]}$ (expected $7$ or $6$, as"
                              " written by mosquitto_passwd)")
    raise UnsupportedHash("the password is not hashed (run mosquitto_passwd -U on the file)")


def _b64(text: str) -> bytes:
    data = base64.b64decode(text, validate=True)
    if not data:
        raise PasswordFileError("empty salt or hash")
    return data


def parse_password_file(text: str, name: str) -> tuple[dict[str, Hash | None], list[str]]:
    """Users (None: an entry whose hash cannot be checked, always refused) and a warning
    for each such entry."""
    users: dict[str, Hash | None] = {}
    warnings: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        username, colon, hashed = line.partition(":")
        if not colon or not username:
            raise PasswordFileError(f"{name}:{number}: expected USERNAME:HASH")
        try:
            users[username] = parse_hash(hashed)
        except UnsupportedHash as error:
            users[username] = None
            warnings.append(f"{name}:{number}: user {username!r} refused: {error}")
        except PasswordFileError as error:
            raise PasswordFileError(f"{name}:{number}: user {username!r}: {error}") from None
    return users, warnings


def set_user(text: str, username: str, hashed: Hash | None) -> str:
    """The file with `username`'s entry replaced, added (at the end) or, for None, removed;
    every other line, comments included, kept as it was."""
    if not username or ":" in username:
        raise PasswordFileError(f"invalid user name {username!r} (empty, or contains ':')")
    lines, found = [], False
    for raw in text.splitlines():
        if raw.strip().partition(":")[0] == username and not raw.lstrip().startswith("#"):
            found = True
            if hashed is not None:
                lines.append(f"{username}:{hashed}")
            continue
        lines.append(raw)
    if hashed is not None and not found:
        lines.append(f"{username}:{hashed}")
    return "".join(line + "\n" for line in lines)


def user_names(text: str) -> list[str]:
    return [line.strip().partition(":")[0] for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
