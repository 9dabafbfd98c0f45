"""manifest.json of a sealed slab: what a reader outside the broker (a Spark job) needs to
decide whether to read a slab and how, without opening LevelDB.

Fields: format, shard, generation, since/until (the generation's period, microseconds),
min_timestamp/max_timestamp (of the stored messages), messages, bytes, streams (id and
structure, e.g. `metrics/+/cpu`), lts (thresholds and edges, see lts.py), key_format and
value_format (see keys.py and ttv.py). Its presence is also what marks a generation sealed
on disk, so it is written atomically: a crash leaves either no manifest or a whole one.
"""

import json
from pathlib import Path
from typing import Any

from broker.ds.files import write_atomically

NAME = "manifest.json"
FORMAT = 1


def write_manifest(slab_dir: Path, manifest: dict[str, Any]) -> None:
    body = {"format": FORMAT, **manifest}
    write_atomically(slab_dir / NAME, json.dumps(body, indent=1, sort_keys=True).encode())


def read_manifest(slab_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((slab_dir / NAME).read_bytes())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None
