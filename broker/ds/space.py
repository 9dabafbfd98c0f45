"""Running out of space: telling it from other write errors, refusing writes meanwhile, and
noticing when space is back.

A write that fails for lack of space (LevelDB's `IOError: ... No space left on device`, an
OSError ENOSPC or EDQUOT from a file) closes the gate: from then on durable writes are
refused at once (`StorageRefused`), before they reach LevelDB or the Raft log, and the
node keeps serving everything else. Refusing early matters for LevelDB: after a failed
background compaction or sync a LevelDB refuses every write until it is opened again
(measured on a full tmpfs: freeing space is not enough), so the databases are reopened
before writes resume (Shard.recover, KVStore.recover).

The storage's timer (DurableStorage.watch_space) opens the gate again once the data volume
has room (`has_room`: RESUME_FREE_MIN bytes free, and a hundredth of the volume): a margin,
so that the first writes after it (a LevelDB table of a few MiB, a compaction) do not fill
the volume again at once. The storage quota (`durable_storage.messages.storage_quota`) uses
the same gate under its own reason.
"""

import contextlib
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import plyvel  # type: ignore[import-untyped]

log = logging.getLogger(__name__)

DISK_FULL: Final = "disk_full"
QUOTA: Final = "db_storage_quota_exceeded"
WRITE_FAILED: Final = "write_failed"  # another error: the database is reopened, then retried
RESUME_FREE_MIN: Final = 8 << 20  # bytes free before writes resume, at least...
RESUME_FREE_SHARE: Final = 100  # ...and 1/100 of the volume
RESERVE: Final = "reserve.bin"
RESERVE_MAX: Final = 32 << 20  # bytes kept for a start on a full volume, at most...
RESERVE_SHARE: Final = 4  # ...and a quarter of the volume
_NO_SPACE_ERRNOS: Final = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXTS: Final = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))

# reason, message (None: cleared), details
Listener = Callable[[str, str | None, dict[str, Any]], None]


class StorageRefused(Exception):
    """Durable Storage takes no writes now (no space, or over its quota): the writer's data
    was not stored, and nothing it wrote before is lost."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"durable storage refuses writes ({reason}): {message}")
        self.reason = reason


def out_of_space(error: BaseException) -> bool:
    """Whether a write failed for lack of space (not a bad disk, not a bug)."""
    if isinstance(error, StorageRefused):
        return error.reason == DISK_FULL
    if isinstance(error, OSError) and error.errno in _NO_SPACE_ERRNOS:
        return True
    if isinstance(error, plyvel.Error):
        text = str(error.args[0] if error.args else error)
        return any(reason in text for reason in _NO_SPACE_TEXTS)
    return False


def free_bytes(path: Path) -> tuple[int, int]:
    """(bytes free to an unprivileged writer, size of the volume) of the volume of `path`."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path` (a database's size on disk), 0 if it is gone;
    files removed while it walks are skipped."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def reserve_bytes(root: Path) -> int:
    return min(RESERVE_MAX, free_bytes(root)[1] // RESERVE_SHARE)


def release_reserve_if_short(root: Path) -> bool:
    """At start-up, before any database opens: frees the reserve when the volume has less
    free than it holds. Opening a LevelDB writes (a new manifest, and the log a crash left
    becomes a table), so on a volume filled to the last block a node could not start; the
    reserve it kept makes room for that, and is made again once the volume has room."""
    reserve = root / RESERVE
    if not reserve.exists() or free_bytes(root)[0] >= reserve_bytes(root):
        return False
    log.warning("the data volume is full: freeing the space kept in %s so that the databases"
                " can open", reserve)
    reserve.unlink()
    return True


class SpaceGuard:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.listeners: list[Listener] = []
        self._refusing: dict[str, StorageRefused] = {}
        self.refused = 0  # writes refused while the gate was closed
        self.held: set[str] = set()  # other writers of the node that have no space (`hold`)

    @property
    def refusing(self) -> bool:
        return bool(self._refusing)

    def reason(self, name: str) -> bool:
        return name in self._refusing

    def check(self) -> None:
        """Raises StorageRefused while writes are refused."""
        if self._refusing:
            self.refused += 1
            raise next(iter(self._refusing.values()))

    def failed(self, error: BaseException) -> bool:
        """A write failed: closes the gate if for lack of space (True then)."""
        if not out_of_space(error):
            return False
        if DISK_FULL not in self._refusing:
            free, size = free_bytes(self.root)
            self.refuse(DISK_FULL, f"no space left on the data volume ({error})",
                        {"path": str(self.root), "free_bytes": free, "size_bytes": size})
        return True

    def hold(self, writer: str, error: BaseException | None) -> None:
        """Another writer of the node (the Raft log, perhaps on a volume of its own) has no
        space (`error`), or has again (None): durable writes are refused while one has none,
        since what they would write goes through it."""
        if error is None:
            self.held.discard(writer)
            return
        self.held.add(writer)
        self.failed(error)

    def refuse(self, reason: str, message: str, details: dict[str, Any]) -> None:
        if reason in self._refusing:
            return
        log.error("durable storage refuses writes: %s", message)
        self._refusing[reason] = StorageRefused(reason, message)
        for listener in self.listeners:
            listener(reason, message, details)

    def allow(self, reason: str) -> None:
        if self._refusing.pop(reason, None) is None:
            return
        log.warning("durable storage takes writes again (%s cleared)", reason)
        for listener in self.listeners:
            listener(reason, None, {})

    def has_room(self) -> bool:
        """Whether writes may resume: the reserve is in place (made again first if a start
        on a full volume freed it) and the volume has RESUME_FREE_MIN free beside it."""
        if not self.keep_reserve():
            return False
        free, size = free_bytes(self.root)
        return free >= max(RESUME_FREE_MIN, size // RESUME_FREE_SHARE)

    def keep_reserve(self) -> bool:
        """Makes the reserve (release_reserve_if_short) if it is missing and the volume has
        room for it and the resume margin; whether it is in place."""
        path = self.root / RESERVE
        if path.exists():
            return True
        size = reserve_bytes(self.root)
        if free_bytes(self.root)[0] < size + RESUME_FREE_MIN:
            return False
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)  # blocks taken now, not when written
            os.fsync(fd)
        except OSError as error:
            log.warning("cannot keep %d bytes in reserve in %s: %s", size, path, error)
            tmp.unlink()
            return False
        finally:
            os.close(fd)
        tmp.rename(path)
        return True
