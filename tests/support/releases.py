"""Earlier releases of the broker, built from git for the tests that open their data.

`RELEASES` (at the repository's root) lists them, one `release commit` a line; a release's
code is `git archive` of its commit (no worktree: the checkout stays as it is), and a broker
of it runs with only that code on its path (`env`, for BrokerProcess).
"""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def releases() -> dict[str, str]:
    """release -> commit, oldest first."""
    found = {}
    for line in (ROOT / "RELEASES").read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            release, commit = fields
            found[release] = commit
    return found


def build(release: str, into: Path) -> Path:
    """The broker code of `release` under `into` (made); returns `into`."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", releases()[release], "broker"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def env(code: Path) -> dict[str, str]:
    """The environment a broker of `code` runs with: its package first and alone (`python -m`
    would put the working directory, this tree, before PYTHONPATH)."""
    return {"PYTHONPATH": str(code), "PYTHONSAFEPATH": "1"}
