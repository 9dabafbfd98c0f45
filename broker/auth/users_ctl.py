"""`broker ctl users`'s arguments; the command itself is in users_edit.py, imported when it
runs: password hashing and SCRAM are not what other `broker ctl` commands (a backup's
export or import, timed with the CLI's start) should wait for."""

import argparse
from typing import Any


def _users(args: argparse.Namespace) -> int:
    from broker.auth.users_edit import users_command

    return users_command(args)


def add_users_parser(topics: Any) -> None:
    users = topics.add_parser("users", help="the password file or the SCRAM user file: add,"
                              " passwd, delete, list")
    users.add_argument("action", choices=["add", "passwd", "delete", "list"])
    users.add_argument("username", nargs="?")
    users.add_argument("--file", required=True, help="the password file (Mosquitto's format)"
                       " or, with --scram, the SCRAM user file")
    users.add_argument("--scram", action="store_true",
                       help="edit authentication.scram.user_file (SCRAM-SHA-256/512 users)")
    users.add_argument("--superuser", action="store_true",
                       help="with --scram: the user is not subject to the ACL")
    users.add_argument("--iterations", type=int,
                       help="with --scram: PBKDF2 iterations (authentication.scram."
                       "iteration_count)")
    users.add_argument("--password", help="instead of asking (visible to other local users"
                       " in the process list: prefer the prompt)")
    users.set_defaults(func=_users)
