"""Writer process for the kill -9 test: writes batches forever, reporting each one on stdout
only after Durable Storage said it is durable.

    python tests/ds/crash_writer.py DATA_DIR
Lines: `durable <batch>` (50 messages `crash/<batch % 13>/<j>` from publisher `p<batch % 7>`)
and `committed <n>` (a sessions transaction that set key `tx/<n>`).
"""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.ds import TTV, DurableStorage, Settings

PER_BATCH = 50
# Small generations so that rotations and seals happen while the writer is killed.
SETTINGS = Settings(n_shards=4, generation_max_size=64 * 1024, flush_interval=0.002)


def batch_messages(batch: int) -> list[TTV]:
    return [TTV(f"crash/{batch % 13}/{j}", b"%d:%d" % (batch, j) + bytes(200), 1, False,
                f"p{batch % 7}") for j in range(PER_BATCH)]


async def write_batches(storage: DurableStorage, first: int, step: int) -> None:
    batch = first
    while True:
        await storage.store_batch("messages", batch_messages(batch), sync=True)
        print(f"durable {batch}", flush=True)
        batch += step


async def commit_transactions(storage: DurableStorage) -> None:
    n = 0
    while True:
        tx = storage.begin()
        tx.put(b"tx/%d" % n, b"x")
        await storage.commit(tx)
        print(f"committed {n}", flush=True)
        n += 1


async def main(data_dir: Path) -> None:
    storage = DurableStorage(data_dir, SETTINGS)
    writers = 3  # several batches in flight at once, on different shards
    await asyncio.gather(commit_transactions(storage),
                         *(write_batches(storage, i, writers) for i in range(writers)))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
