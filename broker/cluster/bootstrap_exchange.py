"""The asyncio shell of the metadata group's bootstrap (broker/cluster/bootstrap.py, pure):
the coordinator's attempt (RPC `raft_prepare` to every running peer, then `raft_decided`),
a peer's answers to those, and a promise whose outcome never arrived settled by asking its
coordinator (RPC `raft_status`). The state is saved in `<data_dir>/raft/metadata.json`
before anything it announces happens; creating or joining the group is the caller's.
"""

import asyncio
import json
import logging
import secrets
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Final

from broker.cluster.bootstrap import MEMBER, UNKNOWN, Attempt, Bootstrap, GroupRecord
from broker.cluster.rpc import Rpc, RpcError
from broker.cluster.service import Cluster
from broker.ds.files import write_atomically

log = logging.getLogger(__name__)

_STATE_FILE: Final = "metadata.json"
_STATUS_EVERY: Final = 10  # maintenance rounds between asking a coordinator about a promise


class BootstrapExchange:
    def __init__(self, cluster: Cluster, rpc: Rpc, directory: Path, n_sites: int, timeout: float,
                 spawn: Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"],
                 create: Callable[[GroupRecord], None],
                 created_by_coordinator: Callable[[GroupRecord], None],
                 name_of: Callable[[str], str]) -> None:
        """`create`: this node coordinated and recorded the group, which it creates now;
        `created_by_coordinator`: the coordinator of a promise this node gave did."""
        self._cluster = cluster
        self._rpc = rpc
        self._me = cluster.me.site
        self._dir = directory
        self._timeout = timeout  # of a `raft_prepare` call
        self._spawn = spawn
        self._create = create
        self._created_by_coordinator = created_by_coordinator
        self._name_of = name_of
        self.bootstrap = self._load(n_sites)
        self._attempt: asyncio.Task[None] | None = None
        self._rounds = 0
        for name, method in (("raft_prepare", self._rpc_prepare),
                             ("raft_decided", self._rpc_decided),
                             ("raft_status", self._rpc_status)):
            rpc.register(name, method)

    def round(self) -> None:
        """A maintenance round: an attempt to create the group when this node coordinates,
        and a promise settled when its coordinator left or its outcome is overdue."""
        self._rounds += 1
        cluster, bootstrap = self._cluster, self.bootstrap
        promise = bootstrap.promise
        if self._attempt is None:
            attempt = bootstrap.attempt(set(cluster.membership.running()), cluster.joined,
                                        secrets.randbits(63) | 1)
            if attempt is not None:
                self._attempt = self._spawn(self._run(attempt))
        if promise is not None:
            if bootstrap.release_orphaned(set(cluster.membership.members)):
                self.save()
            elif self._rounds % _STATUS_EVERY == 0:
                self._spawn(self._ask_status(promise.epoch, promise.coordinator))

    async def _run(self, attempt: Attempt) -> None:
        try:
            params = {"epoch": attempt.epoch, "coordinator": self._me,
                      "voters": list(attempt.voters)}
            answers = await asyncio.gather(*(
                self._rpc.call(peer, "raft_prepare", params, timeout=self._timeout)
                for peer in attempt.peers), return_exceptions=True)
            refusals = {peer: answer for peer, answer in zip(attempt.peers, answers, strict=True)
                        if answer != ""}
            record = self.bootstrap.attempt_done(attempt, not refusals)
            if record is None:
                log.info("not creating the metadata group yet: %s", ", ".join(
                    f"{self._name_of(peer)}: {answer}" for peer, answer in refusals.items()))
            else:
                self._create(record)
            await asyncio.gather(*(
                self._rpc.call(peer, "raft_decided", {"epoch": attempt.epoch,
                                                      "created": record is not None})
                for peer in attempt.peers if peer not in refusals), return_exceptions=True)
        finally:
            self._attempt = None

    def _rpc_prepare(self, params: Any) -> str:
        refusal = self.bootstrap.prepare(int(params["epoch"]), str(params["coordinator"]),
                                         tuple(params["voters"]))
        if not refusal:
            self.save()
        return refusal

    def _rpc_decided(self, params: Any) -> None:
        self._decided(int(params["epoch"]), bool(params["created"]))

    def _rpc_status(self, params: Any) -> str:
        return self.bootstrap.status(int(params["epoch"]))

    async def _ask_status(self, epoch: int, coordinator: str) -> None:
        try:
            answer = await self._rpc.call(coordinator, "raft_status", {"epoch": epoch})
        except RpcError:
            return
        if answer in (MEMBER, UNKNOWN):
            self._decided(epoch, answer == MEMBER)

    def _decided(self, epoch: int, created: bool) -> None:
        had_promise = self.bootstrap.promise is not None
        record = self.bootstrap.decided(epoch, created)
        if record is not None:
            self._created_by_coordinator(record)
        elif had_promise and self.bootstrap.promise is None:
            self.save()

    # ---- persistence ----------------------------------------------------------------------
    def _load(self, n_sites: int) -> Bootstrap:
        try:
            saved = json.loads((self._dir / _STATE_FILE).read_text())
        except FileNotFoundError:
            return Bootstrap(self._me, n_sites)
        return Bootstrap.from_json(self._me, n_sites, saved)

    def save(self) -> None:
        """Durably, before anything it announces happens (a promise answered, a group
        created or joined): a restart must not forget a promise or a membership."""
        self._dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self._dir / _STATE_FILE,
                         json.dumps(self.bootstrap.to_json(), indent=1).encode())
