"""`broker ctl users add|passwd|delete|list --file F` (users_ctl.py): the password file without
`mosquitto_passwd`, in the same format, so either tool can edit what the other wrote; with
`--scram`, the SCRAM user file (`authentication.scram.user_file`) instead.

The file is replaced atomically (write, fsync, rename): a broker watching it reloads a
whole file, never a half-written one.
"""

import argparse
import getpass
import sys
from pathlib import Path

from broker.auth.passwords import PasswordFileError, make_hash, set_user, user_names
from broker.auth.scram import DEFAULT_ITERATIONS
from broker.auth.scram_users import ScramFileError, dump_scram_file, make_user, parse_scram_file


def users_command(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        text = path.read_text() if path.exists() else ""
        edit = _scram_users if args.scram else _password_users
        changed = edit(args, text, str(path))
        if changed is None:
            return 0
        # Here: its package (Durable Storage) is not what other `broker ctl` commands wait for.
        from broker.ds.files import write_atomically

        write_atomically(path, changed.encode(), 0o600)
    except (OSError, PasswordFileError, ScramFileError) as error:
        print(f"broker ctl users: {error}", file=sys.stderr)
        return 1
    return 0


def _checked(args: argparse.Namespace, known: bool, name: str) -> None:
    """Raises for a user name missing, unknown to passwd or delete, or known to add."""
    if not args.username:
        raise PasswordFileError(f"`users {args.action}` needs a user name")
    if args.action in ("delete", "passwd") and not known:
        raise PasswordFileError(f"no user {args.username!r} in {name}")
    if args.action == "add" and known:
        raise PasswordFileError(f"user {args.username!r} exists (use passwd)")


def _password_users(args: argparse.Namespace, text: str, name: str) -> str | None:
    """The password file's new text, or None when there is nothing to write (`list`)."""
    names = user_names(text)
    if args.action == "list":
        for user in names:
            print(user)
        return None
    _checked(args, args.username in names, name)
    hashed = None if args.action == "delete" else make_hash(_password(args).encode())
    return set_user(text, args.username, hashed)


def _scram_users(args: argparse.Namespace, text: str, name: str) -> str | None:
    """The SCRAM file's new text, or None when there is nothing to write (`list`)."""
    users = parse_scram_file(text, name)
    if args.action == "list":
        for user in users.values():
            print(user.user_id + (" (superuser)" if user.is_superuser else ""))
        return None
    _checked(args, args.username in users, name)
    if args.action == "delete":
        del users[args.username]
    else:
        iterations = DEFAULT_ITERATIONS if args.iterations is None else args.iterations
        users[args.username] = make_user(args.username, _password(args).encode(),
                                         args.superuser, iterations)
    return dump_scram_file(users)


def _password(args: argparse.Namespace) -> str:
    return args.password if args.password is not None else _ask()


def _ask() -> str:
    password = getpass.getpass("Password: ")
    if getpass.getpass("Reenter password: ") != password:
        raise PasswordFileError("passwords do not match")
    return password
