"""Password checks on worker threads: answers come back on the loop to plain callbacks (a
check's error too, and one failing callback strands no other), and `authenticate_now`, the
CONNECT's path without coroutines, decides as `authenticate` does."""

import asyncio
import threading
from pathlib import Path

import pytest

from broker.auth.hash_workers import Done, HashWorkers
from broker.auth.passwords import make_hash
from broker.auth.security import Outcome, Security
from broker.config.loader import load_config
from broker.mqtt.constants import ReasonCode


async def test_answers_reach_their_callbacks_on_the_loop(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    workers = HashWorkers(2, "test-hash")
    got: dict[str, tuple[object, int]] = {}
    all_in = asyncio.Event()

    def answer(name: str) -> Done:
        def done(result: bool | BaseException) -> None:
            got[name] = (result, threading.get_ident())
            if len(got) == 3:
                all_in.set()
        return done

    def broken(result: bool | BaseException) -> None:
        raise RuntimeError("a bug in one CONNECT's continuation")

    def fails() -> bool:
        raise ValueError("bad salt")

    try:
        workers.check(lambda: True, answer("right"))
        workers.check(lambda: True, broken)
        workers.check(fails, answer("error"))
        workers.check(lambda: False, answer("wrong"))
        await asyncio.wait_for(all_in.wait(), 10)
    finally:
        workers.stop()
    loop_thread = threading.get_ident()
    assert got["right"] == (True, loop_thread) and got["wrong"] == (False, loop_thread)
    error, thread = got["error"]
    assert isinstance(error, ValueError) and thread == loop_thread
    assert "password check callback failed" in caplog.text



async def test_authenticate_now_decides_as_authenticate(tmp_path: Path) -> None:
    passwords = tmp_path / "passwd"
    passwords.write_text(f"alice:{make_hash(b'right')}\n")
    security = Security(load_config(None, [f"authentication.password_file={passwords}"]))
    security.start()
    try:
        assert security.answers_now
        for username, password, code in (("alice", b"right", ReasonCode.SUCCESS),
                                         ("alice", b"wrong", ReasonCode.BAD_USER_NAME_OR_PASSWORD),
                                         ("alice", None, ReasonCode.BAD_USER_NAME_OR_PASSWORD),
                                         ("mallory", b"x", ReasonCode.BAD_USER_NAME_OR_PASSWORD),
                                         (None, None, ReasonCode.NOT_AUTHORIZED)):
            later: asyncio.Future[Outcome | BaseException] = (
                asyncio.get_running_loop().create_future())
            now = security.authenticate_now("c", username, password, later.set_result)
            # Only a password to hash waits: the rest is decided at once.
            assert (now is None) == (username == "alice" and password is not None)
            outcome = await later if now is None else now
            assert isinstance(outcome, Outcome) and outcome.code == code, username
            assert (await security.authenticate("c", username, password, lambda: "")) == outcome
        assert security.stats.auth_failures == {"bad_password": 4, "unknown_user": 2,
                                                "anonymous": 2}
    finally:
        await security.stop()
