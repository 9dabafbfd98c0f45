"""Fencing of durable sessions in the replicated `sessions` database: a node that lost a
session to another node's claim can no longer change it, whatever it still writes."""

import pytest

from broker.ds import replication_layer as cmd
from broker.session.durable import records as r
from broker.session.durable.ownership import admitted, sweep_writes

Store = dict[bytes, bytes]


def meta(site: str, epoch: int, connected: bool = False, created: bool = False) -> bytes:
    return r.Meta(60, 5, connected, None, None, site, epoch, created).to_bytes()


def created(site: str, epoch: int) -> bytes:
    return meta(site, epoch, connected=True, created=True)


def apply_refused(store: Store, writer: str, writes: list[tuple[bytes, bytes | None]],
                  at: int = 1) -> tuple[list[bytes], set[str]]:
    """What a replica does with one KV command (of serial `at`); returns the admitted keys
    and the client IDs of the refused writes."""
    command = cmd.decode_kv(cmd.encode_kv(writer, at, 0, writes))
    kept, refused = admitted(writer, command.writes, store.get, command.serial)
    for key, value in kept:
        if value is None:
            store.pop(key, None)
        else:
            store[key] = value
    return [key for key, _ in kept], refused


def apply(store: Store, writer: str, writes: list[tuple[bytes, bytes | None]],
          at: int = 1) -> list[bytes]:
    return apply_refused(store, writer, writes, at)[0]


POSITION = r.position_key("c", "t/#", r.Stream("messages", 0, 1, 2))


def test_the_owner_changes_its_session() -> None:
    store: Store = {}
    assert apply(store, "A", [(r.meta_key("c"), created("A", 0)), (POSITION, b"1")]) == [
        r.meta_key("c"), POSITION]
    assert apply(store, "A", [(POSITION, b"2")]) == [POSITION]
    assert store[POSITION] == b"2"


def test_a_claim_fences_off_the_previous_owner() -> None:
    store: Store = {r.meta_key("c"): meta("A", 3), POSITION: b"5"}
    assert apply(store, "B", [(r.meta_key("c"), meta("B", 4))]) == [r.meta_key("c")]
    # A, frozen while the client moved, wakes and writes what it had: all refused.
    assert apply(store, "A", [(POSITION, b"1"), (r.meta_key("c"), meta("A", 3))]) == []
    assert apply(store, "A", [(r.meta_key("c"), None)]) == []
    assert r.Meta.from_bytes(store[r.meta_key("c")]).site == "B"
    assert store[POSITION] == b"5"
    assert apply(store, "B", [(POSITION, b"9")]) == [POSITION]


def test_of_two_claims_with_one_epoch_the_first_applied_wins() -> None:
    store: Store = {r.meta_key("c"): meta("A", 1)}
    assert apply(store, "B", [(r.meta_key("c"), meta("B", 2)), (POSITION, b"b")]) != []
    assert apply(store, "C", [(r.meta_key("c"), meta("C", 2)), (POSITION, b"c")]) == []
    assert store[POSITION] == b"b"


def test_an_owner_of_an_older_epoch_is_refused_even_on_the_same_node() -> None:
    store: Store = {r.meta_key("c"): meta("A", 5)}
    assert apply(store, "A", [(r.meta_key("c"), meta("A", 4))]) == []


def test_the_owner_deletes_its_session_in_one_command() -> None:
    store: Store = {r.meta_key("c"): meta("A", 1), POSITION: b"1"}
    assert sorted(apply(store, "A", [(r.meta_key("c"), None), (POSITION, None)])) == sorted(
        [r.meta_key("c"), POSITION, r.ended_key("c")])
    assert store == {r.ended_key("c"): r.dumps({"epoch": 1, "at": 1})}  # the tombstone


def test_state_of_a_session_with_no_meta_is_refused() -> None:
    """Left by a node fenced off after the session ended: it would be read back as the
    in-flight state of the next session of that client ID."""
    assert apply({}, "A", [(POSITION, b"1")]) == []


@pytest.mark.parametrize("key", [r.heartbeat_key("A"), r.LEGACY_HEARTBEAT_KEY])
def test_keys_of_no_session_are_admitted(key: bytes) -> None:
    assert apply({}, "A", [(key, b"1.0")]) == [key]


def test_a_session_from_before_replication_belongs_to_its_writer() -> None:
    store: Store = {r.meta_key("c"): meta("", 0)}
    assert apply(store, "A", [(POSITION, b"1"), (r.meta_key("c"), meta("A", 0))]) == [
        POSITION, r.meta_key("c")]


def test_barrier_and_kv_commands_round_trip() -> None:
    assert cmd.is_barrier(cmd.BARRIER_COMMAND)
    assert not cmd.is_barrier(cmd.encode_kv("A", 1, 0, []))
    assert cmd.decode_kv(cmd.encode_kv("site-é", 7, 5, [(b"k", None), (b"l", b"v")])) == (
        "site-é", 7, 5, [(b"k", None), (b"l", b"v")])
    data = cmd.encode_kv("A", 2, 1, [(b"k", b"v")])
    for bad in (data[:-1], data + b"\x00", data[:17] + b"\xff" + data[18:]):  # 17: wlen
        with pytest.raises(cmd.BadCommand):
            cmd.decode_kv(bad)


@pytest.mark.parametrize("stale", [meta("A", 3), created("A", 3)])
def test_a_stale_holder_cannot_bring_an_ended_session_back(stale: bytes) -> None:
    """A held the session; B claimed it and ended it (its client left with expiry 0) while
    A was frozen. A wakes and writes its meta (disconnected) and read positions; with the
    `created` flag still set when A was cut off before applying its own first meta."""
    store: Store = {r.meta_key("c"): meta("A", 3), POSITION: b"1"}
    apply(store, "B", [(r.meta_key("c"), meta("B", 4))])
    apply(store, "B", [(r.meta_key("c"), None), (POSITION, None)])
    assert apply_refused(store, "A", [(r.meta_key("c"), stale), (POSITION, b"7")]) == (
        [], {"c"})
    assert store == {r.ended_key("c"): r.dumps({"epoch": 4, "at": 1})}


def test_a_new_session_of_an_ended_id_clears_its_tombstone() -> None:
    store: Store = {r.ended_key("c"): b'{"epoch":4}'}
    assert sorted(apply(store, "C", [(r.meta_key("c"), created("C", 1_700_000_000_000_000))])
                  ) == sorted([r.meta_key("c"), r.ended_key("c")])
    assert list(store) == [r.meta_key("c")]


def test_a_new_session_stays_above_every_earlier_epoch_of_its_id() -> None:
    """B's session (epoch 3) ended; a new one was created (epoch: wall clock). A, which held
    the ID at epoch 2 while frozen, cannot pass its stale meta for a claim."""
    store: Store = {r.ended_key("c"): b'{"epoch":3}'}
    apply(store, "C", [(r.meta_key("c"), created("C", 1_700_000_000_000_000))])
    assert apply_refused(store, "A", [(r.meta_key("c"), meta("A", 2)), (POSITION, b"7")]) == (
        [], {"c"})
    assert r.Meta.from_bytes(store[r.meta_key("c")]).site == "C"


def test_of_two_nodes_creating_one_session_the_first_applied_keeps_it() -> None:
    """Two CONNECTs of a new client ID on two sides of a partition: both nodes create the
    session; the second is told, whatever its epoch."""
    store: Store = {}
    assert apply(store, "B", [(r.meta_key("c"), created("B", 100)), (POSITION, b"b")]) != []
    assert apply_refused(store, "A", [(r.meta_key("c"), created("A", 200)),
                                      (POSITION, b"a")]) == ([], {"c"})
    assert r.Meta.from_bytes(store[r.meta_key("c")]).site == "B"
    assert store[POSITION] == b"b"


def test_an_owner_replaces_its_session_in_one_command() -> None:
    """A Clean Start: the old session's delete and the new one's meta in one turn, merged
    into one write of the meta (the last change of a key wins)."""
    store: Store = {r.meta_key("c"): meta("A", 5), POSITION: b"1"}
    assert apply(store, "A", [(r.meta_key("c"), created("A", 6)), (POSITION, None)]) == [
        r.meta_key("c"), POSITION]
    # The same command again (a retried forward whose answer was lost): still A's.
    assert apply(store, "A", [(r.meta_key("c"), created("A", 6))]) == [r.meta_key("c")]
    assert apply_refused(store, "A", [(r.meta_key("c"), created("A", 4))]) == ([], {"c"})


def test_deleting_what_is_gone_changes_nothing_and_refuses_nothing() -> None:
    store: Store = {}
    assert apply_refused(store, "A", [(r.meta_key("c"), None)]) == ([r.meta_key("c")], set())


def ended(client_id: str, at: int, epoch: int = 4) -> Store:
    """A store holding one tombstone: `client_id`'s session ended at `at` (its command's
    serial, in microseconds)."""
    store: Store = {r.meta_key(client_id): meta("A", epoch)}
    apply(store, "A", [(r.meta_key(client_id), None)], at=at)
    return store


def sweep(store: Store, cutoff: int) -> list[bytes]:
    """What the sessions group's leader does (`sweep_tombstones`), applied on a replica."""
    tombstones = sorted((k, v) for k, v in store.items() if r.split_key(k)[0] == b"e")
    writes = sweep_writes(tombstones, cutoff)
    return apply(store, "L", writes, at=cutoff + 10**9) if writes else []


def test_a_tombstone_keeps_when_its_session_ended() -> None:
    assert r.loads(ended("c", at=1_000)[r.ended_key("c")]) == {"epoch": 4, "at": 1_000}


def test_a_sweep_forgets_tombstones_that_ended_before_its_cutoff() -> None:
    store = {**ended("old", at=1_000), **ended("new", at=5_000)}
    store[r.ended_key("unknown")] = r.dumps({"epoch": 2})  # from before ends were dated
    assert sweep(store, cutoff=2_000) == [r.ended_key("old")]
    assert sorted(store) == sorted([r.ended_key("new"), r.ended_key("unknown")])
    assert sweep(store, cutoff=1_500) == []  # nothing is due: no command at all


def test_a_tombstone_set_again_before_the_sweep_applies_stays() -> None:
    """The leader read an old tombstone; before its command applied, the ID came back and
    its new session ended too: the new tombstone is not the one the sweep was for."""
    store = ended("c", at=1_000)
    writes = sweep_writes([(r.ended_key("c"), store[r.ended_key("c")])], cutoff=2_000)
    apply(store, "B", [(r.meta_key("c"), created("B", 9_000))], at=8_000)
    apply(store, "B", [(r.meta_key("c"), None)], at=9_500)
    assert apply_refused(store, "L", writes, at=10**9) == ([], set())
    assert r.loads(store[r.ended_key("c")])["at"] == 9_500


def test_tombstones_are_written_by_replicas_alone() -> None:
    """A writer's own `e` writes (and a cutoff's key) are never stored, nor refused."""
    store = ended("c", at=1_000)
    tombstone = store[r.ended_key("c")]
    assert apply_refused(store, "A", [(r.ended_key("c"), None), (r.ended_key("d"), b"{}"),
                                      (r.TOMBSTONE_SWEEP_KEY, None)]) == ([], set())
    assert store == {r.ended_key("c"): tombstone}
