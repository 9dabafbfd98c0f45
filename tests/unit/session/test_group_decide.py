"""A durable group decided again as its members come and go (groups.py): each member's
state is looked up once, then only those of the members that changed, and every one again
at a tick with replicated storage (a member's node may have gone down meanwhile)."""

from collections import Counter
from types import SimpleNamespace
from typing import Any

from broker.session.durable.group_records import OWN, REVOKE
from broker.session.durable.groups import GONE, READY, GroupManager
from broker.stats import Stats

SHARE = "$share/g/jobs/#"
N_SHARDS = 4


class FakeStore:
    """Takes the writes; the owner changes are acted on at once (builtin_local)."""

    def write(self, writes: Any) -> None:
        return None

    def write_soon(self, writes: Any) -> None:
        return None

    def owner_tenure(self, share: str, shard: int) -> int:
        return 0


def manager_of(states: dict[str, str], looked: Counter[str]) -> GroupManager:
    def state(client_id: str) -> str:
        looked[client_id] += 1
        return states[client_id]

    ds = SimpleNamespace(messages=SimpleNamespace(n_shards=N_SHARDS))
    manager = GroupManager(ds, FakeStore(), Stats(), {}, state, False)  # type: ignore[arg-type]
    for client_id in states:
        manager.join(SHARE, client_id, 1)
    return manager


def owners(manager: GroupManager) -> Counter[tuple[str | None, str]]:
    return Counter((o.client, o.state) for o in manager.groups[SHARE].owners.values())


def test_only_the_members_that_changed_are_looked_at_again() -> None:
    states = {f"m{i:04d}": GONE for i in range(1000)}
    states["m0500"] = READY
    looked: Counter[str] = Counter()
    manager = manager_of(states, looked)
    manager._decide()  # no loop running: the test decides when a pass would run
    assert sum(looked.values()) == 1000
    assert owners(manager) == Counter({("m0500", OWN): N_SHARDS})

    looked.clear()
    states["m0007"] = READY
    manager.changed(SHARE, "m0007")
    manager._decide()
    assert looked == Counter({"m0007": 1})
    assert owners(manager) == Counter({("m0500", REVOKE): 2, ("m0500", OWN): 2})

    looked.clear()
    states["m0500"] = GONE
    manager.leave(SHARE, "m0500")  # its session ended: its shards go to the other one
    manager._decide()
    assert looked == Counter()  # no longer a member: not looked up
    assert owners(manager) == Counter({("m0007", OWN): N_SHARDS})


def test_with_replicated_storage_a_tick_looks_at_every_member_again() -> None:
    states = {f"m{i}": READY for i in range(10)}
    looked: Counter[str] = Counter()
    manager = manager_of(states, looked)
    manager._decide()
    manager._decide()
    assert looked == Counter(list(states))  # once each: nothing changed
    manager.replicated = True
    manager.tick()
    manager._decide()
    assert looked == Counter({client_id: 2 for client_id in states})
