"""Earlier releases of the broker, built from git for upgrade tests.

`RELEASES` (the repository's root) lists them, one `release commit` per line. A release's
tree is exported with `git archive` (not a worktree: nothing of this checkout's git state
changes), once per directory, and a BrokerProcess runs it with `code=` that directory:

    old = build_release("0.1.0", tmp_path / "0.1.0")
    BrokerProcess(data_dir, settings, code=old).start()

It runs in pure Python (no native build is made for it), as any checkout without one does.
"""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def releases() -> dict[str, str]:
    """release -> commit, as RELEASES lists them (comments and blank lines skipped)."""
    listed: dict[str, str] = {}
    for line in (ROOT / "RELEASES").read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            release, commit = words
            listed[release] = commit
    return listed


def build_release(release: str, directory: Path) -> Path:
    """The source tree of `release` in `directory` (made if absent), ready to run."""
    marker = directory / ".release"
    if marker.is_file() and marker.read_text() == release:
        return directory
    commit = releases()[release]
    directory.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", commit],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(directory)], stdin=archive.stdout, check=True)
    assert archive.stdout is not None
    archive.stdout.close()
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} (release {release}) failed")
    marker.write_text(release)
    return directory
