"""`broker ctl users add|passwd|delete|list --file F`: the password file without
`mosquitto_passwd`, in the same format, so either tool can edit what the other wrote.

The file is replaced atomically (write, fsync, rename): a broker watching it reloads a
whole file, never a half-written one.
"""

import argparse
import getpass
import sys
from pathlib import Path
from typing import Any

from broker.auth.passwords import PasswordFileError, make_hash, set_user, user_names
from broker.ds.files import write_atomically


def users_command(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        text = path.read_text() if path.exists() else ""
        if args.action == "list":
            for name in user_names(text):
                print(name)
            return 0
        if not args.username:
            raise PasswordFileError(f"`users {args.action}` needs a user name")
        known = args.username in user_names(text)
        if args.action == "delete":
            if not known:
                raise PasswordFileError(f"no user {args.username!r} in {path}")
            text = set_user(text, args.username, None)
        else:
            if args.action == "passwd" and not known:
                raise PasswordFileError(f"no user {args.username!r} in {path}")
            if args.action == "add" and known:
                raise PasswordFileError(f"user {args.username!r} exists (use passwd)")
            password = args.password if args.password is not None else _ask()
            text = set_user(text, args.username, make_hash(password.encode()))
        write_atomically(path, text.encode())
        path.chmod(0o600)
    except (OSError, PasswordFileError) as error:
        print(f"broker ctl users: {error}", file=sys.stderr)
        return 1
    return 0


def _ask() -> str:
    password = getpass.getpass("Password: ")
    if getpass.getpass("Reenter password: ") != password:
        raise PasswordFileError("passwords do not match")
    return password


def add_users_parser(topics: Any) -> None:
    users = topics.add_parser("users", help="the password file: add, passwd, delete, list")
    users.add_argument("action", choices=["add", "passwd", "delete", "list"])
    users.add_argument("username", nargs="?")
    users.add_argument("--file", required=True, help="the password file (Mosquitto's format)")
    users.add_argument("--password", help="instead of asking (visible to other local users"
                       " in the process list: prefer the prompt)")
    users.set_defaults(func=users_command)
