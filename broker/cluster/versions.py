"""Cluster versions: what nodes of different releases can run together (pure rules).

A node's code can run the cluster at a range of *cluster versions*, which it announces at
the handshake with its release. The cluster runs at its *effective version*: a Raft
command of the metadata group (broker/cluster/version_keeper.py) that rises once every
member runs code that supports a higher one, and never falls (as RabbitMQ's `ra` machine
versions and EMQX's cluster version). A command kind or encoding introduced at cluster
version N is proposed only once the effective version is N or more: before that some
member may be unable to apply it. A node whose code cannot run the effective version is
refused at the handshake: it would fail on, or worse skip, the entries its peers propose.

Release 0.1.0 announced no range: a peer without one runs cluster version 0 only.

Cluster versions, and what each introduced:
    0  release 0.1.0
    1  release 0.2.0: the effective-version command itself; durable shared-subscription
       groups (their writes to `sessions` are fenced by the replicas, which 0.1.0 does not
       do: its replica would admit what the others refuse); Raft's TimeoutNow (leadership
       transfer), which 0.1.0's Raft does not decode; Durable Storage's LOAD command (a
       backup imported into a running cluster, broker/backup/restore.py), which 0.1.0's
       replica skips as unknown: it would lack every restored message. (0.2.0 was not yet
       released when LOAD was added: no release runs version 1 without it.)
    2  a shard's Raft snapshot of version 2, its sealed generations shipped as their files
       (broker/ds/shipped.py), which a node of version 1 reads as a garbled snapshot
"""

from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from broker.version import RELEASE

LOWEST: Final = 0  # the lowest cluster version this code can run
HIGHEST: Final = 2  # the highest
# The first cluster version of each feature whose commands or messages older code cannot
# take: proposed (or sent to a peer) only at this version or above. (The version command
# needs no gate: it is proposed only to rise to a version every member runs.)
DURABLE_GROUPS: Final = 1
TIMEOUT_NOW: Final = 1
LOAD: Final = 1
FILE_SNAPSHOTS: Final = 2

# RUN_BY[v]: the first release that runs cluster version v (a data dir records the version
# its cluster runs, broker/format_check.py: older code refuses it naming this release).
RUN_BY: Final = ("0.1.0", "0.2.0", "0.2.0")

TOO_OLD: Final = "too old"  # handshake refusal reasons (handshake.REASONS)
TOO_NEW: Final = "too new"
LEGACY_RELEASE: Final = "0.1.0"  # a peer that announces no release (RELEASES' first)


class Speaks(NamedTuple):
    """A node's release and the cluster versions its code can run."""

    release: str
    lowest: int
    highest: int



MINE: Final = Speaks(RELEASE, LOWEST, HIGHEST)
LEGACY: Final = Speaks(LEGACY_RELEASE, 0, 0)


def announce(me: Speaks = MINE) -> dict[str, Any]:
    """The handshake fields (added to release 0.1.0's, which ignores unknown fields)."""
    return {"release": me.release, "cluster_version": [me.lowest, me.highest]}


def from_handshake(message: Mapping[str, Any]) -> Speaks | None:
    """What a peer's hello or challenge announces: LEGACY without the fields, None when
    they are there but not a release and a range (the handshake calls that malformed)."""
    if "cluster_version" not in message and "release" not in message:
        return LEGACY
    release, versions = message.get("release"), message.get("cluster_version")
    if (not isinstance(release, str) or not release or len(release) > 64
            or not isinstance(versions, list) or len(versions) != 2
            or not all(type(v) is int and v >= 0 for v in versions)
            or versions[0] > versions[1]):
        return None
    return Speaks(release, versions[0], versions[1])


def refusal(peer: Speaks, effective: int) -> tuple[str, str] | None:
    """(reason, detail) when a peer's code cannot run this cluster's effective version,
    None when it can.

    Too old: e.g. release 0.1.0 back on a node after the cluster rose to version 1 with
    every member on 0.2.0 (the effective version never falls). Short: a log line clips it
    (logsafe), the node's name follows it. Too new: a release that no
    longer runs the versions this cluster still does (upgrade through one that does)."""
    if peer.highest < effective:
        return TOO_OLD, (f"release {peer.release} runs cluster versions up to {peer.highest},"
                         f" the cluster runs {effective}: run {MINE.release} or newer")
    if peer.lowest > effective:
        return TOO_NEW, (f"release {peer.release} runs cluster versions from {peer.lowest},"
                         f" the cluster runs {effective}: upgrade through a release that"
                         f" runs both")
    return None


def load_refusal(effective: int) -> str | None:
    """Why an import cannot write LOAD commands into a cluster running `effective` (None:
    it can). Said before anything is proposed: the archive is checked and nothing changed."""
    if effective >= LOAD:
        return None
    return (f"the cluster runs cluster version {effective}; an import writes LOAD commands,"
            f" which version {LOAD} introduced (a member on release {LEGACY_RELEASE} would"
            f" skip them and lack the restored messages): upgrade every member to"
            f" {MINE.release} or newer (GET /api/v5/cluster shows each one's release), wait"
            f" for the cluster version to rise, then import again")


def next_version(effective: int, members: Iterable[Speaks | None]) -> int | None:
    """The version the cluster may rise to now, None if it stays: the highest every member
    runs, when above the effective one. A member whose code is unknown (down, or no link)
    holds it where it is: it may come back running older code."""
    highest = [member.highest if member is not None else -1 for member in members]
    target = min(highest, default=-1)
    return target if target > effective else None
