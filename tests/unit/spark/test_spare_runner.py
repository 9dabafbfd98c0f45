"""spark-apps/spare_runner.py with a probe module in place of Spark's streaming source
runner: real processes, the test process standing in for the JVM (the runner's parent)."""

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SPARE = Path(__file__).resolve().parents[3] / "spark-apps" / "spare_runner.py"
# The runner's dependencies: one line in $PROBE_IMPORTS each time they are imported.
HEAVY = """
import os
with open(os.environ["PROBE_IMPORTS"], "a") as log:
    log.write(f"{os.getpid()}\\n")
"""
# The runner, run as __main__: what it runs with, on stdout; with PROBE_BLOCK, it then
# waits for stdin to close; exits with $PROBE_EXIT.
PROBE = """
import json, os, sys
import heavy
if __name__ == "__main__":
    print(json.dumps({"pid": os.getpid(), "parent": os.getppid(),
                      "value": os.environ.get("PROBE_VALUE"), "cwd": os.getcwd()}), flush=True)
    if os.environ.get("PROBE_BLOCK"):
        sys.stdin.read()
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""
_WAIT_S = 60


@pytest.fixture
def probe_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "heavy.py").write_text(HEAVY)
    local = tmp_path / "blockmgr"
    local.mkdir()
    return {**os.environ, "PYTHONPATH": str(tmp_path), "SPARK_LOCAL_DIRS": str(local),
            "PROBE_IMPORTS": str(tmp_path / "imports")}


@dataclass
class Jvm:
    """A stand-in for the JVM: a shell whose child is the first run (it writes that run's
    output to `first`), then waits for its stdin to close."""

    proc: subprocess.Popen[bytes]
    first: Path

    def end(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=_WAIT_S)


@pytest.fixture
def jvm(probe_env: dict[str, str], tmp_path: Path) -> Iterator[Jvm]:
    first = tmp_path / "first.json"
    proc = subprocess.Popen(
        ["sh", "-c", '"$0" -S "$1" probe > "$2.part" && mv "$2.part" "$2"; read line',
         sys.executable, str(SPARE), str(first)],
        env={**probe_env, "PROBE_VALUE": "first"}, stdin=subprocess.PIPE)
    try:
        while not first.exists():  # written by another process: polled
            assert proc.poll() is None
            select.select([], [], [], 0.05)
        yield Jvm(proc, first)
    finally:
        if proc.poll() is None:  # its spare ends with it
            Jvm(proc, first).end()


def _run(env: dict[str, str], cwd: Path | None = None, **extra: str,
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-S", str(SPARE), "probe"], env={**env, **extra},
                          cwd=cwd, capture_output=True, text=True, timeout=_WAIT_S)


def _ends(pid: int) -> bool:
    """Waits (on a pidfd) for process `pid` to exit; False if it is still there after
    _WAIT_S."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], _WAIT_S)[0])
    finally:
        os.close(fd)


def _imports(env: dict[str, str]) -> int:
    return len(Path(env["PROBE_IMPORTS"]).read_text().splitlines())


def test_the_first_run_imports_and_leaves_a_spare_that_later_runs_fork_from(
        probe_env: dict[str, str], jvm: Jvm, tmp_path: Path) -> None:
    first = json.loads(jvm.first.read_text())
    assert first["value"] == "first"
    assert first["parent"] == jvm.proc.pid

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    runs = [_run(probe_env, cwd=elsewhere, PROBE_VALUE=f"later {i}", PROBE_EXIT=str(i + 2))
            for i in range(2)]
    assert [run.returncode for run in runs] == [2, 3], runs[0].stderr
    ran = [json.loads(run.stdout) for run in runs]
    # the caller's environment and working directory, in children of one spare
    assert [(r["value"], r["cwd"]) for r in ran] == [("later 0", str(elsewhere)),
                                                      ("later 1", str(elsewhere))]
    assert ran[0]["parent"] == ran[1]["parent"] not in (os.getpid(), jvm.proc.pid)
    assert _imports(probe_env) == 1  # imported by the first run, never again


def test_without_a_local_dir_each_run_imports_for_itself(probe_env: dict[str, str]) -> None:
    env = {k: v for k, v in probe_env.items() if k != "SPARK_LOCAL_DIRS"}
    for _ in range(2):
        assert _run(env).returncode == 0
    assert _imports(env) == 2


def test_sigterm_to_the_caller_ends_the_child(probe_env: dict[str, str], jvm: Jvm) -> None:
    caller = subprocess.Popen([sys.executable, "-S", str(SPARE), "probe"],
                              env={**probe_env, "PROBE_BLOCK": "1"}, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout is not None
        child = json.loads(caller.stdout.readline())["pid"]
        assert child != caller.pid
        caller.send_signal(signal.SIGTERM)
        assert caller.wait(timeout=_WAIT_S) != 0
        assert _ends(child)
    finally:
        caller.kill()
        caller.wait()


def test_the_spare_ends_with_its_jvm(probe_env: dict[str, str], jvm: Jvm) -> None:
    ran = _run(probe_env)
    assert ran.returncode == 0, ran.stderr
    spare = json.loads(ran.stdout)["parent"]
    jvm.end()
    assert _ends(spare)
