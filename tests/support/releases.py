"""Earlier releases of the broker (the `RELEASES` file), as source trees built from git, so
upgrade tests run the code a user really has installed: `BrokerProcess(code=...)` starts one.

A release is the tree of its commit (`git archive`), run in pure Python with this tree's
virtualenv; the dependencies it needs are a subset of ours. Built once per test session.
"""

import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]


def releases() -> dict[str, str]:
    """release -> commit, oldest first, from the RELEASES file."""
    found: dict[str, str] = {}
    for line in (ROOT / "RELEASES").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            release, commit = line.split()
            found[release] = commit
    return found


def build(release: str, into: Path) -> Path:
    """The source tree of `release` under `into` (made once): a directory to run
    `python -m broker` from. Fails, naming the commit, in a clone without it (shallow)."""
    commit = releases()[release]
    tree = into / f"broker-{release}"
    if (tree / "broker" / "__init__.py").exists():
        return tree
    tree.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "broker"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise RuntimeError(f"release {release} needs commit {commit} in this clone (a full,"
                           f" not shallow, clone): {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree
