"""What a directory tree holds, to show that something left it as it was."""

import hashlib
from pathlib import Path


def state(root: Path) -> dict[str, tuple[int, int, str] | None]:
    """Every entry under `root`: a file's (mtime, size, SHA-256), None for a directory."""
    found: dict[str, tuple[int, int, str] | None] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_dir():
            found[name] = None
        else:
            info = path.stat()
            found[name] = (info.st_mtime_ns, info.st_size,
                           hashlib.sha256(path.read_bytes()).hexdigest())
    return found
