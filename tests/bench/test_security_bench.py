"""Smoke test of bench/security_bench.py at a tiny scale: its figures are only worth something
if every CONNECT it counts was answered by an accepting CONNACK (on both brokers, with the
same password file) and if its ACL file has the rules it claims and lets the benchmark's
clients through."""

import os
import pwd
from pathlib import Path

import pytest

from bench import brokers, security_bench
from bench.auth_service import allow_service
from bench.logins import ScramLogin
from broker.auth.acl import Access, parse_acl_file


@pytest.mark.parametrize("name", security_bench.ALL_BROKERS)
def test_connect_round_counts_only_accepted_connections(name: str, tmp_path: Path) -> None:
    if name == "mosquitto" and not brokers.MOSQUITTO_BIN.exists():
        pytest.skip("Debian's mosquitto is not installed")
    users = [("alice", "wonder:land"), ("bob", "builder")]
    passwords = tmp_path / "passwd"
    security_bench.make_password_file(passwords, users)
    launcher = (brokers.ours_with({"authentication.password_file": str(passwords)}, users[0])
                if name == "ours" else brokers.mosquitto_with(
                    f"password_file {passwords}\nallow_anonymous false\n"
                    f"user {pwd.getpwuid(os.getuid()).pw_name}\n", users[0]))
    good = security_bench.connect_round(name, launcher, 200, 8, users)
    assert good.ok and good.verified, good.error
    assert good.details["accepted"] == 200 and good.value is not None and good.value > 0
    wrong = security_bench.connect_round(name, launcher, 50, 8, [("alice", "wrong")])
    assert wrong.ok and not wrong.verified
    assert wrong.details["accepted"] == 0 and wrong.details["refused_or_failed"] == 50


def test_the_acl_file_has_its_rules_and_lets_the_benchmark_through(tmp_path: Path) -> None:
    path = tmp_path / "acl"
    security_bench.make_acl_file(path, 100)
    acl = parse_acl_file(path.read_text(), str(path))
    assert acl.allows("bench-ours-b-pub0", None, "bench/qos1_1to1/000", Access.WRITE)
    assert acl.allows("bench-ours-b-sub0", None, "bench/qos1_1to1/000", Access.READ)
    assert not acl.allows("c", None, "tenants/0/0/x", Access.READ)


def test_a_jwt_round_counts_only_accepted_connections(tmp_path: Path) -> None:
    """The JWT case: every token the benchmark makes is accepted; a token signed with
    another secret is refused, and the round says so."""
    tokens = security_bench.jwt_users()[:2]
    launcher = brokers.ours_with({"authentication.jwt.secret": security_bench.JWT_SECRET},
                                 tokens[0])
    good = security_bench.connect_round("ours_jwt", launcher, 200, 8, tokens)
    assert good.ok and good.verified, good.error
    assert good.details["accepted"] == 200
    forged = tokens[0][1][:-4] + ("AAAA" if not tokens[0][1].endswith("AAAA") else "BBBB")
    wrong = security_bench.connect_round("ours_jwt", launcher, 50, 8, [("user0", forged)])
    assert wrong.ok and not wrong.verified and wrong.details["accepted"] == 0


def test_a_scram_round_counts_only_accepted_connections(tmp_path: Path) -> None:
    """Every SCRAM login completes (the CONNACK's server-final checked by the client); a
    wrong password is refused, and the round says so."""
    users = [("alice", "wonder:land"), ("bob", "builder")]
    scram = tmp_path / "scram.json"
    security_bench.make_scram_file(scram, users)
    launcher = brokers.ours_with({"authentication.scram.user_file": str(scram)})
    good = security_bench.connect_round("ours_scram", launcher, 200, 8, users, ScramLogin)
    assert good.ok and good.verified, good.error
    assert good.details["accepted"] == 200
    wrong = security_bench.connect_round("ours_scram", launcher, 50, 8, [("alice", "wrong")],
                                         ScramLogin)
    assert wrong.ok and not wrong.verified and wrong.details["accepted"] == 0


def test_an_http_round_asks_the_service(tmp_path: Path) -> None:
    """With the bench's service every CONNECT is accepted; with no service at that URL
    every one is refused (0x88), so an accepted round did go through the service."""
    users = [("alice", "pw")]
    with allow_service(brokers.load_cpus()) as url:
        launcher = brokers.ours_with({"authentication.http.url": url}, users[0])
        good = security_bench.connect_round("ours_http", launcher, 200, 8, users)
    assert good.ok and good.verified, good.error
    dead = brokers.ours_with({"authentication.http.url": url, "authentication.allow_anonymous":
                              "true"})
    wrong = security_bench.connect_round("ours_http", dead, 50, 8, users)
    assert wrong.ok and not wrong.verified and wrong.details["accepted"] == 0
