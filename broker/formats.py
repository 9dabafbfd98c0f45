"""Every format the broker keeps on disk: where it lives, its version, and the oldest release
that reads each version. The rules (when to bump, what readers keep) are docs/formats.md.

A node refuses a data dir it cannot read before it changes anything in it, naming the file,
the version and the release to run instead; it can only name that release if the newer
release wrote it down. So each directory tree the broker writes (the data dir, and the Raft
write-ahead log's directory, which may be elsewhere) holds a stamp, `formats.json`, that
lists the version of every format in it and, for each, the oldest release that reads it.
A tree without a stamp was written by 0.1.0, before stamps: all its formats are version 0.

This module is a leaf (it imports nothing of the broker but the release), so the stores,
the start-up check and the tests all read the one list.
"""

from typing import Any, Final, NamedTuple

from broker.version import RELEASE

STAMP: Final = "formats.json"
# What marks a JSON file as a stamp of this broker (a foreign file named formats.json is
# refused, not overwritten).
STAMP_KIND: Final = "mqtt-broker-formats"

DATA_DIR: Final = "data dir"
WAL_DIR: Final = "write-ahead log dir"

# A write-ahead log segment starts with this and its layout's version as one ASCII digit,
# the version of the `wal` format that wrote it: 0.1.0 wrote "RAFTWAL1" already (its
# unstamped segments, version 0, have version 1's layout).
WAL_SEGMENT_MAGIC: Final = b"RAFTWAL"


class Format(NamedTuple):
    name: str
    where: str  # relative to its tree, for people
    tree: str  # DATA_DIR or WAL_DIR: the stamp that records it
    # read_by[v]: the oldest release that reads version v; the last one is the version this
    # release writes. Version 0 is a tree without a stamp (0.1.0).
    read_by: tuple[str, ...]
    # Small files of it that start-up reads whole (glob patterns): the check refuses one that
    # is not ours (`.json`: a JSON object; else one line of text) naming it, before the code
    # that reads it fails on it with less to say, other stores already opened (written).
    files: tuple[str, ...] = ()

    @property
    def version(self) -> int:
        return len(self.read_by) - 1


# Version 1 of each is 0.1.0's layout with a stamp beside it: 0.1.0 reads it (it ignores
# the stamp), so a downgrade to 0.1.0 keeps working until a format changes.
_FIRST: Final = ("0.1.0", "0.1.0")

FORMATS: Final = (
    Format("site", "ds/site_id, ds/incarnation (16 hex digits each)", DATA_DIR, _FIRST,
           ("ds/site_id", "ds/incarnation")),
    Format("messages", "ds/messages/: db.json, shard-NNN/gen-NNNNNN LevelDB slabs (TTV values"
           " carry their own version byte), a sealed slab's manifest.json, replica indexes,"
           " shard-NNN.snapshot-files/ (sealed generations' files received so far)",
           DATA_DIR, _FIRST, ("ds/messages/db.json", "ds/messages/shard-*/gen-*/manifest.json")),
    Format("sessions", "ds/sessions/: LevelDB of durable sessions (records.py)", DATA_DIR,
           _FIRST),
    Format("retained", "retained/: LevelDB of retained messages (a format byte per record)",
           DATA_DIR, _FIRST),
    Format("raft-metadata", "raft/metadata.json: the metadata group's first voters",
           DATA_DIR, _FIRST, ("raft/metadata.json",)),
    Format("cluster", "cluster/members.json, cluster/cookie", DATA_DIR, _FIRST,
           ("cluster/members.json", "cluster/cookie")),
    Format("api-key", "api_key: the generated administrator key", DATA_DIR, _FIRST),
    Format("wal", "*.wal: Raft write-ahead log segments, each headed RAFTWAL<version>",
           WAL_DIR, _FIRST),
)

BY_NAME: Final = {fmt.name: fmt for fmt in FORMATS}
WAL: Final = BY_NAME["wal"]


def in_tree(tree: str) -> tuple[Format, ...]:
    return tuple(fmt for fmt in FORMATS if fmt.tree == tree)


def wal_segment_header() -> bytes:
    """What this release's write-ahead log segments start with."""
    return WAL_SEGMENT_MAGIC + str(WAL.version).encode()


def stamp_of(tree: str) -> dict[str, Any]:
    """What this release writes as the stamp of `tree` (the JSON object)."""
    return {"kind": STAMP_KIND, "written_by": RELEASE,
            "formats": {fmt.name: {"version": fmt.version, "read_by": fmt.read_by[-1]}
                        for fmt in in_tree(tree)}}
