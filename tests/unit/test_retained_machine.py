"""The retained messages' Raft state machine over a real RetainedStore: entries applied with
their position, replay after a restart, snapshots out and in, the pending overlay."""

import tracemalloc
from pathlib import Path

import pytest

from broker.raft import spool
from broker.raft.messages import CONFIG, NOOP, NORMAL, Config, Entry
from broker.raft.ready import SnapshotChunk
from broker.retainer.machine import (
    BadCommand,
    RetainedMachine,
    decode_commands,
    decode_version,
    encode_commands,
    encode_version,
)
from broker.retainer.store import RetainedStore, encode_record
from broker.session.message import Message


def _store(path: Path, max_messages: int = 0) -> RetainedStore:
    return RetainedStore(path, max_messages, 1 << 20, 0)


def _entry(index: int, *messages: Message, term: int = 1) -> Entry:
    return Entry(index, term, NORMAL, encode_commands([encode_record(m) for m in messages]))


def _topics(store: RetainedStore) -> dict[str, bytes]:
    return {m.topic: m.payload for m in store.match("#")}


def test_commands_round_trip_and_garbage_is_refused() -> None:
    messages = [Message("a/b", b"1", 1, True, "p", {0x03: "text/plain"}),
                Message("a/c", b"", 0, True, "q")]
    decoded = decode_commands(encode_commands([encode_record(m) for m in messages]))
    assert [(m.topic, m.payload, m.publisher) for m, _ in decoded] == [
        ("a/b", b"1", "p"), ("a/c", b"", "q")]
    for bad in (b"", b"\x00\x00\x00\x01", encode_commands([b"x"]) + b"!"):
        with pytest.raises(BadCommand):
            decode_commands(bad)


def test_entries_apply_with_their_position_and_replay_is_a_no_op(tmp_path: Path) -> None:
    store = _store(tmp_path)
    machine = RetainedMachine(store, lambda _: None)
    machine.apply(Entry(1, 1, CONFIG, Config(frozenset({"a"})).encode()))
    machine.apply(_entry(2, Message("t/1", b"one", retain=True),
                         Message("t/2", b"two", retain=True)))
    machine.apply(_entry(3, Message("t/1", b"", retain=True)))
    machine.apply(Entry(4, 2, NOOP, b""))
    assert _topics(store) == {"t/2": b"two"}
    assert (machine.applied_index, store.applied()) == (4, (3, 1))  # data's last entry
    store.close()
    # After a restart the core hands entries after the stored position only.
    store = _store(tmp_path)
    machine = RetainedMachine(store, lambda _: None)
    assert machine.applied_index == 3 and _topics(store) == {"t/2": b"two"}
    assert not machine.unlogged()
    store.close()


def test_flush_makes_applied_data_durable_and_says_how_far_the_log_may_go(
        tmp_path: Path) -> None:
    store = _store(tmp_path)
    machine = RetainedMachine(store, lambda _: None)
    assert machine.flushed_index == 0
    machine.apply(_entry(1, Message("t", b"v", retain=True)))
    machine.apply(Entry(2, 1, NOOP, b""))
    assert machine.flush() == 2 and store.applied() == (2, 1)
    store.close()


def test_the_message_limit_refuses_alike_on_every_replica(tmp_path: Path) -> None:
    refused: list[int] = []
    store = _store(tmp_path, max_messages=1)
    machine = RetainedMachine(store, refused.append)
    machine.apply(_entry(1, Message("a", b"1", retain=True), Message("b", b"2", retain=True),
                         Message("a", b"3", retain=True)))
    assert _topics(store) == {"a": b"3"} and refused == [1]
    store.close()


def test_a_garbled_entry_is_skipped_and_counted(tmp_path: Path) -> None:
    store = _store(tmp_path)
    machine = RetainedMachine(store, lambda _: None)
    machine.apply(Entry(1, 1, NORMAL, b"garbage"))
    assert machine.bad_commands == 1 and machine.applied_index == 1 and len(store) == 0
    store.close()


async def test_a_snapshot_goes_out_in_chunks_and_replaces_a_peers_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spool, "CHUNK_BYTES", 100)
    leader_store = _store(tmp_path / "leader")
    leader = RetainedMachine(leader_store, lambda _: None)
    leader.apply(_entry(1, *(Message(f"s/{i}", b"v%d" % i, retain=True) for i in range(20))))
    leader.apply(Entry(2, 1, NOOP, b""))
    peer_store = _store(tmp_path / "peer")
    peer = RetainedMachine(peer_store, lambda _: None)
    peer.apply(_entry(1, Message("stale", b"x", retain=True)))
    config = Config(frozenset({"a", "b"}))
    chunks = await _transfer(leader, peer, config)
    assert chunks > 3
    assert _topics(peer_store) == _topics(leader_store) and len(peer_store) == 20
    assert peer.applied_index == 2 and peer.flushed_index == 2
    peer_store.close()
    # Kept durably with the data, for the core after a restart.
    peer_store = _store(tmp_path / "peer")
    peer = RetainedMachine(peer_store, lambda _: None)
    snapshot = peer.snapshot()
    assert snapshot is not None and (snapshot.index, snapshot.config) == (2, config)
    assert peer.applied_index == 2
    peer_store.close()
    leader_store.close()


async def test_a_large_retained_set_moves_off_the_event_loop_without_a_copy_in_memory(
        tmp_path: Path) -> None:
    leader_store = _store(tmp_path / "leader")
    leader = RetainedMachine(leader_store, lambda _: None)
    for index in range(1, 41):  # 40 x 100 messages of 4 KiB: 16 MiB
        leader.apply(_entry(index, *(Message(f"s/{index}/{i}", bytes(4096), retain=True)
                                     for i in range(100))))
    told: list[int] = []
    leader.spool.on_dumped = lambda: told.append(leader.applied_index)
    assert leader.snapshot_chunk(0, 0) is None  # dumping, on a worker thread
    leader.apply(_entry(41, Message("late", b"after the dump began", retain=True)))
    assert leader.flush() == 40  # the log keeps what follows the snapshot being made
    peer_store = _store(tmp_path / "peer")
    peer = RetainedMachine(peer_store, lambda _: None)
    tracemalloc.start()
    try:
        await _transfer(leader, peer, Config(frozenset({"a"})))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert told == [41]
    # The store itself holds the messages in memory (its topic trie): the peer's new copy
    # is counted here, once, and nothing more than a chunk besides.
    assert peak < 24 << 20, f"{peak / 2**20:.1f} MiB held at once for 16 MiB of messages"
    assert len(peer_store) == 4000 and "late" not in _topics(peer_store)
    assert peer.applied_index == 40
    assert list(tmp_path.rglob("*.snapshot*")) == []
    peer_store.close()
    leader.spool.end_dump(for_good=True)
    leader_store.close()


async def _transfer(leader: RetainedMachine, peer: RetainedMachine, config: Config) -> int:
    """A snapshot moved chunk by chunk as the core asks for them; how many chunks."""
    index = offset = chunks = 0
    while True:
        answer = leader.snapshot_chunk(index, offset)
        if answer is None:  # dumping: the core is told when it is done
            assert leader.spool.dumped is not None
            await leader.spool.dumped
            continue
        at, data, done = answer
        peer.install_chunk(SnapshotChunk(at, 1, config, offset, data, done))
        chunks += 1
        if done:
            return chunks
        index, offset = at, offset + len(data)


def test_the_cluster_version_entry_is_applied_kept_and_never_falls(tmp_path: Path) -> None:
    assert decode_version(encode_version(1)) == 1
    assert decode_version(_entry(1, Message("t", b"v", retain=True)).data) is None
    with pytest.raises(BadCommand):  # what release 0.1.0 makes of it: skipped, no crash
        decode_commands(encode_version(1))
    store = _store(tmp_path)
    machine = RetainedMachine(store, lambda _: None)
    assert machine.cluster_version == 0
    machine.apply(_entry(1, Message("t", b"v", retain=True)))
    machine.apply(Entry(2, 1, NORMAL, encode_version(1)))
    assert machine.cluster_version == 1 and machine.bad_commands == 0
    machine.apply(Entry(3, 1, NORMAL, encode_version(0)))  # never lower
    assert machine.cluster_version == 1 and _topics(store) == {"t": b"v"}
    store.close()
    store = _store(tmp_path)  # a restart reads it back with the data
    assert RetainedMachine(store, lambda _: None).cluster_version == 1
    assert store.applied() == (3, 1) and len(store) == 1  # a marker, not a topic
    store.close()


async def test_a_snapshot_carries_the_cluster_version(tmp_path: Path) -> None:
    leader_store = _store(tmp_path / "leader")
    leader = RetainedMachine(leader_store, lambda _: None)
    leader.apply(_entry(1, Message("a", b"1", retain=True)))
    leader.apply(Entry(2, 1, NORMAL, encode_version(1)))
    peer_store = _store(tmp_path / "peer")
    peer = RetainedMachine(peer_store, lambda _: None)
    await _transfer(leader, peer, Config(frozenset({"a", "b"})))
    assert peer.cluster_version == 1 and _topics(peer_store) == {"a": b"1"}
    peer_store.close()
    peer_store = _store(tmp_path / "peer")
    assert RetainedMachine(peer_store, lambda _: None).cluster_version == 1
    assert len(peer_store) == 1
    peer_store.close()
    leader_store.close()


def test_pending_writes_show_here_until_released(tmp_path: Path) -> None:
    store = _store(tmp_path)
    machine = RetainedMachine(store, lambda _: None)
    machine.apply(_entry(1, Message("t/old", b"stored", retain=True)))
    store.hold(Message("t/new", b"mine", retain=True))
    store.hold(Message("t/old", b"", retain=True))  # a clear hides the stored one
    assert _topics(store) == {"t/new": b"mine"}
    store.hold(Message("t/new", b"mine2", retain=True))
    store.release("t/new")
    assert _topics(store)["t/new"] == b"mine2"  # one of two still pending
    store.release("t/new")
    store.release("t/old")
    assert _topics(store) == {"t/old": b"stored"}  # neither was applied
    store.close()


def test_retained_messages_from_before_the_group_are_unlogged(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put(Message("legacy", b"v", retain=True))
    assert RetainedMachine(store, lambda _: None).unlogged()
    store.clear()
    assert len(store) == 0 and store.applied() == (0, 0) and store.installed_snapshot() is None
    store.close()


def test_the_leaders_own_entry_is_applied_without_decoding_it_again(tmp_path: Path) -> None:
    store = _store(tmp_path)
    machine = RetainedMachine(store, lambda _: None)
    mine = Message("t/own", b"v", retain=True)
    data = encode_commands([encode_record(mine)])
    machine.proposing(data, [(mine, encode_record(mine))])
    machine.apply(Entry(1, 1, NORMAL, bytes(bytearray(data))))  # equal, not the same: decoded
    assert store.match("t/own")[0] is not mine
    machine.proposing(data, [(mine, encode_record(mine))])
    machine.apply(Entry(2, 1, NORMAL, data))
    assert store.match("t/own")[0] is mine
    store.close()
