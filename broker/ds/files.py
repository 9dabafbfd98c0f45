"""Crash-safe small files: after a crash a file written here is whole (old or new)."""

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Makes a rename or a new entry in `path` survive power loss."""
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
