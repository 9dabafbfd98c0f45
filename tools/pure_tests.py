"""The unit and protocol suites once more, on the broker as pure Python (`make test` runs
this after the main pass, which tests the mypyc-compiled build).

Why both: the `NATIVE=0` image and `tools/build_native.py clean` run the interpreted code,
and compiled and interpreted Python do differ (in a compiled function a name keeps one
type; a compiled `raise ... from` has left `__cause__` empty). The tree is a copy of the
repository's files without the compiled modules, so nothing here can shadow the sources.

    .venv/bin/python tools/pure_tests.py [PYTEST ARGS...]
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "pure"
SUITES = ("tests/unit", "tests/protocol")
# Asserts that the listed modules load compiled: the one test this pass must not run.
NATIVE_ONLY = "tests/unit/test_native.py::test_every_listed_module_runs_compiled"


def source_files() -> list[str]:
    """Tracked files, and new ones git does not ignore (so a change not yet committed is
    tested too); compiled modules and the build's manifest are ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True).stdout.decode()
    return [path for path in listed.split("\0") if path and (ROOT / path).is_file()]


def copy_tree() -> None:
    shutil.rmtree(TREE, ignore_errors=True)
    for path in source_files():
        target = TREE / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, target)


def loaded_from(env: dict[str, str]) -> str:
    """Where the copy imports a compiled-by-default module from."""
    return subprocess.run([sys.executable, "-c", "import broker.node; print(broker.node.__file__)"],
                          cwd=TREE, env=env, check=True, capture_output=True, text=True
                          ).stdout.strip()


def main(args: list[str]) -> int:
    copy_tree()
    env = {**os.environ, "PYTHONPATH": str(TREE)}
    loaded = loaded_from(env)
    if loaded != str(TREE / "broker" / "node.py"):
        sys.exit(f"the pure-Python pass would test {loaded}, not the copy's source")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--deselect", NATIVE_ONLY, *(args or SUITES)]
    return subprocess.run(command, cwd=TREE, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
