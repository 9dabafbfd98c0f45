"""Who starts a Raft group, with which voters, and who only waits to be added: pure.

The trap (EMQX documents it with `durable_storage.n_sites`): nodes started together that
each create a group on their own end up with as many groups as nodes, with histories that
can never be merged. So a node creates nothing by itself unless it is the *coordinator*: it
has finished its first discovery round, it sees at least `n_sites` running members (itself
included) and it has the smallest site ID among them. The voters are the `n_sites` smallest
of those sites (at most VOTER_CAP); the others are added later as learners by the leader.

Views differ while links come up, so two nodes may both think they coordinate. A two-phase
exchange makes that harmless: the coordinator asks every running peer to *promise* (kept on
disk) that it neither has nor will join another group; a node that is a member already, has
promised someone else or coordinates itself refuses. Only when every peer promised does the
coordinator record the group (its random epoch and voters) on disk and create it, then tells
the peers (`commit`). A refusal aborts the attempt, the promises are released, and the next
round's views decide again. A promise whose outcome never arrived is settled by asking the
coordinator (`status`): it has recorded the group, is still asking, or does not know the
epoch (it restarted before recording it: nothing was created), and is dropped when the
coordinator is no longer a member. So two groups can only exist if an operator made them
(nodes given disjoint seeds).

A node that does not coordinate stays blank and adopts the epoch of the first group that
sends it Raft traffic (a leader adding it as a learner, or the coordinator's campaign when it
promised to it); a blank node with a promise adopts only that promise's epoch.
"""

from typing import Any, Final, NamedTuple

VOTER_CAP: Final = 5

MEMBER: Final = "member"
PENDING: Final = "pending"
UNKNOWN: Final = "unknown"


class GroupRecord(NamedTuple):
    """This node is a member of the group incarnation `epoch`; `voters` are the initial
    voters it bootstraps with (empty when it adopted the group from a leader's traffic)."""

    epoch: int
    voters: tuple[str, ...] = ()


class Promise(NamedTuple):
    epoch: int
    coordinator: str
    voters: tuple[str, ...]


class Attempt(NamedTuple):
    epoch: int
    voters: tuple[str, ...]
    peers: tuple[str, ...]  # every running peer: each must promise


class Bootstrap:
    def __init__(self, me: str, n_sites: int, record: GroupRecord | None = None,
                 promise: Promise | None = None) -> None:
        self.me = me
        self.n_sites = n_sites
        self.record = record
        self.promise = promise
        self.attempting: Attempt | None = None

    @property
    def state(self) -> str:
        if self.record is not None:
            return MEMBER
        return "promised" if self.promise is not None else "blank"

    # ---- the coordinator ---------------------------------------------------------------------
    def attempt(self, running: set[str], joined: bool, epoch: int) -> Attempt | None:
        """Starts an attempt when this node coordinates (see the module's docstring);
        `running`: the peers with a link up, `epoch`: a fresh random one (not 0)."""
        if (self.record is not None or self.promise is not None
                or self.attempting is not None or not joined):
            return None
        view = running | {self.me}
        if len(view) < self.n_sites or min(view) != self.me:
            return None
        voters = tuple(sorted(view)[:min(self.n_sites, VOTER_CAP)])
        self.attempting = Attempt(epoch, voters, tuple(sorted(running - {self.me})))
        return self.attempting

    def attempt_done(self, attempt: Attempt, all_promised: bool) -> GroupRecord | None:
        """The peers' answers are in: the group to record and create, or None (abort)."""
        if self.attempting is not attempt:
            return None
        self.attempting = None
        if not all_promised or self.record is not None:
            return None
        self.record = GroupRecord(attempt.epoch, attempt.voters)
        return self.record

    def status(self, epoch: int) -> str:
        """What happened to an attempt, for a peer holding a promise."""
        if self.record is not None and self.record.epoch == epoch:
            return MEMBER
        if self.attempting is not None and self.attempting.epoch == epoch:
            return PENDING
        return UNKNOWN

    # ---- a peer ------------------------------------------------------------------------------
    def prepare(self, epoch: int, coordinator: str, voters: tuple[str, ...]) -> str:
        """A coordinator asks for a promise: "" when given (to be saved before answering),
        else why not."""
        if self.record is not None:
            return f"member of group epoch {self.record.epoch}"
        if self.attempting is not None:
            return "coordinating an attempt of its own"
        if self.promise is not None and self.promise.coordinator != coordinator:
            return f"promised to {self.promise.coordinator}"
        # (A newer attempt of the same coordinator replaces its older one: it gave that up.)
        self.promise = Promise(epoch, coordinator, voters)
        return ""

    def decided(self, epoch: int, created: bool) -> GroupRecord | None:
        """The outcome of the promised attempt (a commit, an abort or a status answer): the
        group to record and create when this node is one of its voters. A promised node
        that is not a voter goes back to blank and waits to be added as a learner."""
        promise = self.promise
        if promise is None or promise.epoch != epoch:
            return None
        self.promise = None
        if created and self.me in promise.voters:
            self.record = GroupRecord(epoch, promise.voters)
            return self.record
        return None

    def release_orphaned(self, members: set[str]) -> bool:
        """Drops a promise to a coordinator that is no longer a member (removed for good:
        it will never say how its attempt ended); True if one was dropped."""
        if self.promise is not None and self.promise.coordinator not in members:
            self.promise = None
            return True
        return False

    def adopt(self, epoch: int) -> GroupRecord | None:
        """Raft traffic of group incarnation `epoch` reached this node: the record to save
        if a blank node (or one that promised exactly that epoch) joins it, else None."""
        if self.record is not None or self.attempting is not None:
            return None
        if self.promise is not None and self.promise.epoch != epoch:
            return None
        self.promise = None
        self.record = GroupRecord(epoch)
        return self.record

    def forget(self) -> None:
        """Back to blank (this node joins another cluster's group, its history discarded)."""
        self.record = None
        self.promise = None
        self.attempting = None

    # ---- persistence -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        record, promise = self.record, self.promise
        return {
            "record": None if record is None else {"epoch": record.epoch,
                                                   "voters": list(record.voters)},
            "promise": None if promise is None else {
                "epoch": promise.epoch, "coordinator": promise.coordinator,
                "voters": list(promise.voters)},
        }

    @classmethod
    def from_json(cls, me: str, n_sites: int, saved: dict[str, Any]) -> "Bootstrap":
        record, promise = saved.get("record"), saved.get("promise")
        return cls(
            me, n_sites,
            None if record is None else GroupRecord(int(record["epoch"]),
                                                    tuple(record["voters"])),
            None if promise is None else Promise(int(promise["epoch"]),
                                                 str(promise["coordinator"]),
                                                 tuple(promise["voters"])),
        )
