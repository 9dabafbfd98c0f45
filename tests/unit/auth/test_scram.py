"""SCRAM: the broker's server and the test client each checked against RFC 7677's example
exchange, then against each other; the enhanced-authentication state machine's rules."""

import base64

import pytest

from broker.auth.enhanced import Continue, EnhancedAuth, Failure, Success
from broker.auth.scram import ScramError, ScramServer, make_credential, parse_client_first
from broker.auth.scram_users import (
    ScramFileError,
    ScramUser,
    dump_scram_file,
    make_user,
    parse_scram_file,
)
from broker.mqtt.constants import PropertyId, ReasonCode
from broker.mqtt.errors import ProtocolError
from tests.support.scram_client import ScramClient

# RFC 7677 section 3: user "user", password "pencil".
CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
MOCK = b"k" * 32


def _rfc_server() -> ScramServer:
    server = ScramServer("sha256")
    credential = make_credential(b"pencil", "sha256", 4096, SALT)
    assert server.first(parse_client_first(CLIENT_FIRST), credential, MOCK,
                        SERVER_NONCE) == SERVER_FIRST
    return server


def test_the_server_reproduces_rfc_7677() -> None:
    assert _rfc_server().final(CLIENT_FINAL) == SERVER_FINAL


def test_the_test_client_reproduces_rfc_7677() -> None:
    client = ScramClient("user", "pencil", "sha256", CLIENT_NONCE)
    assert client.first() == CLIENT_FIRST
    assert client.final(SERVER_FIRST) == CLIENT_FINAL
    assert client.verify(SERVER_FINAL)
    assert not client.verify(SERVER_FINAL.replace(b"6", b"7"))


def test_a_changed_proof_or_nonce_fails() -> None:
    with pytest.raises(ScramError) as failed:
        _rfc_server().final(CLIENT_FINAL.replace(b"p=dHzb", b"p=dHza"))
    assert failed.value.reason == "bad_proof"
    with pytest.raises(ScramError) as failed:
        _rfc_server().final(CLIENT_FINAL.replace(b"hNlF", b"hNlG"))
    assert failed.value.reason == "bad_nonce"


@pytest.mark.parametrize("message", [
    b"", b"x", b"p=tls-unique,,n=user,r=abc", b"n,a=admin,n=user,r=abc", b"n,,r=abc,n=user",
    b"n,,n=us=41r,r=abc", b"n,,n=user,r=a,b", b"n,,m=ext,n=user,r=abc", b"\xff\xfe",
    b"n,,n=user,r=" + b"a" * 5000, b"n,,n=,r=abc", b"n,,n=user,r=a\x01b"])
def test_bad_client_first_messages_fail_cleanly(message: bytes) -> None:
    with pytest.raises(ScramError):
        parse_client_first(message)


@pytest.mark.parametrize("message", [
    b"", b"c=biws", b"c=biws,r=x,p=AAAA", b"c=eSws,r=NONCE,p=AAAA", b"c=biws,r=NONCE,p=!!",
    b"c=biws,r=NONCE,p=AAAA"])
def test_bad_client_final_messages_fail_cleanly(message: bytes) -> None:
    server = ScramServer("sha256")
    first = parse_client_first(b"n,,n=user,r=abc")
    server.first(first, make_credential(b"pw", "sha256", 4096), MOCK, "NONCE")
    with pytest.raises(ScramError):
        server.final(message.replace(b"NONCE", b"abcNONCE"))


def test_user_names_are_unescaped() -> None:
    assert parse_client_first(b"n,,n=a=2Cb=3Dc,r=abc").username == "a,b=c"


def _users() -> dict[str, ScramUser]:
    return {"alice": make_user("alice", b"wonder", False, 4096),
            "root": make_user("root", b"toor", True, 4096)}


def _run(auth: EnhancedAuth, client: ScramClient, reason: int = 0x18,
         connected: bool = False) -> object:
    start = (auth.start(client.first()) if reason == 0x18 else auth.receive(
        ReasonCode.RE_AUTHENTICATE, _props(auth.method, client.first()), connected))
    assert isinstance(start, Continue)
    return auth.receive(0x18, _props(auth.method, client.final(start.data)), connected)


def _props(method: str, data: bytes | None) -> dict[int, object]:
    props: dict[int, object] = {PropertyId.AUTHENTICATION_METHOD: method}
    if data is not None:
        props[PropertyId.AUTHENTICATION_DATA] = data
    return props


@pytest.mark.parametrize("algorithm", ["sha256", "sha512"])
def test_both_methods_log_in_and_prove_the_server(algorithm: str) -> None:
    users = _users()
    client = ScramClient("root", "toor", algorithm)
    auth = EnhancedAuth(client.method, users.get, MOCK)
    done = _run(auth, client)
    assert isinstance(done, Success) and done.superuser and done.username == "root"
    assert client.verify(done.data)


def test_wrong_password_and_unknown_user_fail_alike() -> None:
    users = _users()
    wrong = _run(EnhancedAuth("SCRAM-SHA-256", users.get, MOCK),
                 ScramClient("alice", "nope"))
    unknown = _run(EnhancedAuth("SCRAM-SHA-256", users.get, MOCK),
                   ScramClient("mallory", "nope"))
    assert wrong == Failure("bad_proof") and unknown == Failure("unknown_user")
    # The unknown user's server-first looks like a real one, and is the same each time.
    auth = EnhancedAuth("SCRAM-SHA-256", users.get, MOCK)
    first = auth.start(b"n,,n=mallory,r=abc")
    again = EnhancedAuth("SCRAM-SHA-256", users.get, MOCK).start(b"n,,n=mallory,r=abc")
    assert isinstance(first, Continue) and isinstance(again, Continue)
    assert first.data.split(b",")[1:] == again.data.split(b",")[1:]


def test_reauthentication_rules() -> None:
    users = _users()
    auth = EnhancedAuth("SCRAM-SHA-256", users.get, MOCK)
    assert isinstance(_run(auth, ScramClient("alice", "wonder")), Success)
    # Again on the live connection: the same user succeeds, another one does not.
    assert isinstance(_run(auth, ScramClient("alice", "wonder"), 0x19, True), Success)
    assert _run(auth, ScramClient("root", "toor"), 0x19, True) == Failure("other_user")
    with pytest.raises(ProtocolError):  # before CONNACK
        auth.receive(0x19, _props("SCRAM-SHA-256", b"n,,n=alice,r=x"), False)
    with pytest.raises(ProtocolError):  # another method
        auth.receive(0x19, _props("SCRAM-SHA-512", b"n,,n=alice,r=x"), True)
    with pytest.raises(ProtocolError):  # nothing to continue
        auth.receive(0x18, _props("SCRAM-SHA-256", b"c=biws"), True)
    with pytest.raises(ProtocolError):  # a client's success
        auth.receive(0x00, _props("SCRAM-SHA-256", None), True)
    assert isinstance(auth.receive(0x19, _props("SCRAM-SHA-256", b"n,,n=alice,r=x"), True),
                      Continue)
    with pytest.raises(ProtocolError):  # one while one is under way
        auth.receive(0x19, _props("SCRAM-SHA-256", b"n,,n=alice,r=x"), True)


def test_the_user_file_round_trips_and_bad_files_are_named() -> None:
    users = _users()
    again = parse_scram_file(dump_scram_file(users), "f")
    assert again == users
    assert parse_scram_file("", "f") == {}
    for text in ("[]", '{"version": 2, "users": []}', '{"version": 1, "users": [{}]}',
                 '{"version": 1, "users": [{"user_id": "a", "salt": "!", "iteration_count": 1}]}',
                 "{not json"):
        with pytest.raises(ScramFileError, match=r"^f: "):
            parse_scram_file(text, "f")
