"""The SCRAM user file (`authentication.scram.user_file`), read and written. Pure.

One JSON document: each user as EMQX's SCRAM database keeps one (`user_id`, `salt`,
`stored_key`, `server_key`, `is_superuser`), with the keys of both algorithms, so a client
may log in with SCRAM-SHA-256 or SCRAM-SHA-512, and the iteration count they were made
with, so raising `authentication.scram.iteration_count` does not lock anyone out:

    {"version": 1, "users": [{"user_id": "alice", "is_superuser": false,
      "salt": B64, "iteration_count": 4096,
      "sha256": {"stored_key": B64, "server_key": B64},
      "sha512": {"stored_key": B64, "server_key": B64}}]}

The file holds no password and nothing a client could log in with (a StoredKey is a hash of
the key a proof needs), but it does let its reader pose as the server: keep it 0600.
"""

import base64
import binascii
import json
import secrets
from typing import Any, Final, NamedTuple

from broker.auth.scram import MAX_ITERATIONS, METHODS, Credential, make_credential

FORMAT_VERSION: Final = 1
_SALT_BYTES: Final = 16


class ScramFileError(ValueError):
    pass


class ScramUser(NamedTuple):
    user_id: str
    is_superuser: bool
    credentials: dict[str, Credential]  # hashlib name -> credential

    def summary(self) -> dict[str, object]:
        """What the HTTP API shows of a user (EMQX's shape): never a key or salt."""
        return {"user_id": self.user_id, "is_superuser": self.is_superuser}


def make_user(user_id: str, password: bytes, is_superuser: bool, iterations: int) -> ScramUser:
    """Slow by design (one PBKDF2 per algorithm): run it off the event loop."""
    if not user_id or len(user_id) > 256:
        raise ScramFileError("a user ID is 1 to 256 characters")
    salt = secrets.token_bytes(_SALT_BYTES)
    return ScramUser(user_id, is_superuser, {
        algorithm: make_credential(password, algorithm, iterations, salt)
        for algorithm in METHODS.values()})


def parse_scram_file(text: str, name: str) -> dict[str, ScramUser]:
    if not text.strip():
        return {}
    try:
        document = json.loads(text)
        if document.get("version") != FORMAT_VERSION:
            raise ScramFileError(f"{name}: format version {document.get('version')!r}, this"
                                 f" broker reads {FORMAT_VERSION}")
        users = {}
        for entry in document["users"]:
            user = _user(entry)
            if user.user_id in users:
                raise ScramFileError(f"{name}: user {user.user_id!r} twice")
            users[user.user_id] = user
        return users
    except ScramFileError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as error:
        raise ScramFileError(f"{name}: not a SCRAM user file: {error!r}") from None


def _user(entry: dict[str, Any]) -> ScramUser:
    salt = base64.b64decode(entry["salt"], validate=True)
    iterations = int(entry["iteration_count"])
    if not 0 < iterations <= MAX_ITERATIONS or not salt:
        raise ValueError(f"user {entry['user_id']!r}: bad salt or iteration count")
    credentials = {}
    for algorithm in METHODS.values():
        keys = entry.get(algorithm)
        if keys is not None:
            credentials[algorithm] = Credential(
                salt, iterations, base64.b64decode(keys["stored_key"], validate=True),
                base64.b64decode(keys["server_key"], validate=True))
    user_id = entry["user_id"]
    if not isinstance(user_id, str) or not user_id:
        raise ValueError("a user_id must be a non-empty string")
    return ScramUser(user_id, bool(entry.get("is_superuser", False)), credentials)


def dump_scram_file(users: dict[str, ScramUser]) -> str:
    entries = []
    for user in users.values():
        any_credential = next(iter(user.credentials.values()))
        entry: dict[str, Any] = {
            "user_id": user.user_id, "is_superuser": user.is_superuser,
            "salt": _b64(any_credential.salt), "iteration_count": any_credential.iterations}
        for algorithm, credential in user.credentials.items():
            entry[algorithm] = {"stored_key": _b64(credential.stored_key),
                                "server_key": _b64(credential.server_key)}
        entries.append(entry)
    return json.dumps({"version": FORMAT_VERSION, "users": entries}, indent=1) + "\n"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
