"""Mosquitto's password file: both hash formats, per-entry refusals, edits that keep the
rest of the file."""

import base64
import hashlib

import pytest

from broker.auth.passwords import (
    PasswordFileError,
    make_hash,
    parse_hash,
    parse_password_file,
    set_user,
    user_names,
)

# Written by mosquitto_passwd 2.0.11 for password "secret".
MOSQUITTO_7 = ("$7$101$4Mz3SClMZfR1TV4r$6TjP4SUaJq9EQF5lrr3kYT8pgy6P+2ePeV3izfkQJbekDMRP8cIO6K"
               "DBjliEGeK3ygNluIJsa6JTEMC+UJJRpw==")


def test_pbkdf2_entry_from_mosquitto_passwd() -> None:
    hashed = parse_hash(MOSQUITTO_7)
    assert hashed.iterations == 101
    assert hashed.matches(b"secret") and not hashed.matches(b"Secret")
    assert str(hashed) == MOSQUITTO_7


def test_salted_sha512_entry_of_older_files() -> None:
    salt = b"0123456789ab"
    digest = hashlib.sha512(b"pw" + salt).digest()
    entry = f"$6${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"
    assert parse_hash(entry).matches(b"pw") and not parse_hash(entry).matches(b"px")


def test_unknown_formats_refuse_only_their_user_and_say_why() -> None:
    users, warnings = parse_password_file(f"a:{MOSQUITTO_7}\nb:$5$x$y\nc:plain\n", "f")
    assert users["a"] is not None and users["b"] is None and users["c"] is None
    assert warnings == [
        "f:2: user 'b' refused: unsupported hash format $5$ (expected $7$ or $6$, as written"
        " by mosquitto_passwd)",
        "f:3: user 'c' refused: the password is not hashed (run mosquitto_passwd -U on the"
        " file)"]


@pytest.mark.parametrize("line", ["no-colon", ":$7$101$AAAA$AAAA", "a:$7$x$AAAA$AAAA",
                                  "a:$7$101$!!$AAAA", "a:$7$0$AAAA$AAAA"])
def test_syntax_errors_fail_the_whole_file_naming_the_line(line: str) -> None:
    with pytest.raises(PasswordFileError, match=r"^f:2: "):
        parse_password_file(f"# comment\n{line}\n", "f")


def test_set_user_replaces_adds_and_removes_keeping_other_lines() -> None:
    text = f"# admins\na:{MOSQUITTO_7}\nb:{MOSQUITTO_7}\n"
    fresh = make_hash(b"new")
    changed = set_user(text, "a", fresh)
    assert changed.splitlines()[0] == "# admins" and changed.splitlines()[1] == f"a:{fresh}"
    added = set_user(changed, "c", fresh)
    assert user_names(added) == ["a", "b", "c"]
    assert user_names(set_user(added, "b", None)) == ["a", "c"]
    users, _ = parse_password_file(added, "f")
    assert users["c"] is not None and users["c"].matches(b"new")
    with pytest.raises(PasswordFileError):
        set_user(text, "x:y", fresh)
