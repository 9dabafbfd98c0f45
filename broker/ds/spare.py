"""The next generation's slab of a shard, made ahead on a worker thread.

Creating a LevelDB costs a dozen fsyncs (tens of milliseconds, hundreds on a busy disk),
and a replicated rotation is applied on the event loop, in log order: so the slab the next
rotation needs is made beforehand, after each rotation and when the node starts. It lives
at its final directory, marked as a spare (slab.SPARE_FILE), and is pinned in `OpenSlabs`
as the current slab will be; opening a shard drops the newest slabs still marked
(shard.load_slabs).
"""

import asyncio
import logging
import shutil
from collections.abc import Callable
from concurrent.futures import Executor, Future

from broker.ds.open_slabs import OpenSlabs
from broker.ds.slab import Slab

log = logging.getLogger(__name__)

# (generation) -> a new slab at its final directory, marked a spare (blocking)
Create = Callable[[int], Slab]


class NextSlab:
    def __init__(self, name: str, executor: Executor, open_slabs: OpenSlabs,
                 create: Create) -> None:
        self.name = name
        self._executor = executor
        self._open_slabs = open_slabs
        self._create = create
        self._making: Future[Slab] | None = None
        self.wanted = False  # made again after each rotation

    def prepare(self, generation: int) -> "Future[Slab]":
        """Starts making the slab of `generation` (any thread) unless one is on its way;
        returns the making."""
        self.wanted = True
        if self._making is None:
            self._making = self._executor.submit(self._make, generation)
        return self._making

    def _make(self, generation: int) -> Slab:
        spare = self._create(generation)
        self._open_slabs.acquire(spare)
        return spare

    def _taken(self) -> "Future[Slab] | None":
        making, self._making = self._making, None
        return making

    def _usable(self, making: "Future[Slab]", generation: int) -> Slab | None:
        try:
            spare = making.result()
        except Exception as error:
            log.warning("%s: making the next generation ahead failed (made at the rotation"
                        " instead): %s", self.name, error)
            return None
        if spare.generation == generation:
            return spare
        self._discard(spare)
        return None

    async def take(self, generation: int) -> Slab | None:
        """The spare of `generation`, pinned (waiting while it is being made), if any."""
        making = self._taken()
        if making is None:
            return None
        await asyncio.wait([asyncio.wrap_future(making)])
        return self._usable(making, generation)

    def take_now(self, generation: int) -> Slab | None:
        """`take` on the loop: blocks only while the spare is still being made (a rotation
        right after the previous one, or the start)."""
        making = self._taken()
        return None if making is None else self._usable(making, generation)

    def _discard(self, spare: Slab) -> None:
        self._open_slabs.release(spare)
        self._open_slabs.drop(spare)
        shutil.rmtree(spare.path, ignore_errors=True)

    def discard(self) -> None:
        """Blocking: no spare is left, closed and removed (waits for one being made): the
        shard's directory is about to be replaced, or the shard closes."""
        making = self._taken()
        if making is not None:
            try:
                self._discard(making.result())
            except Exception as error:
                log.warning("%s: a spare slab failed: %s", self.name, error)
