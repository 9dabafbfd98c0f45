"""The index of durable sessions out of memory: which are here, and which are due when."""

from broker.session.durable.offline import OfflineSessions


def test_sessions_come_due_by_the_second_never_early() -> None:
    offline = OfflineSessions()
    offline.add("a", 100.2)
    offline.add("b", 100.9)
    offline.add("c", 105.0)
    offline.add("never", None)
    assert offline.next_due() == 101  # rounded up: never early
    assert offline.due(100.9) == []
    assert sorted(offline.due(101.0)) == ["a", "b"]
    assert ("a" in offline, "c" in offline, "never" in offline) == (False, True, True)
    assert offline.next_due() == 105
    assert offline.due(1e9) == ["c"]
    assert offline.next_due() is None
    assert offline.ids() == ["never"]


def test_a_session_loaded_again_is_no_longer_due() -> None:
    offline = OfflineSessions()
    offline.add("a", 10)
    offline.add("b", 10)
    assert offline.discard("a") is True
    assert offline.discard("a") is False
    assert offline.due(10) == ["b"]
    offline.add("c", 20)
    offline.discard("c")
    assert offline.next_due() is None
    assert len(offline) == 0


def test_adding_again_moves_the_deadline() -> None:
    offline = OfflineSessions()
    offline.add("a", 10)
    offline.add("a", 30)
    assert offline.due(20) == []
    assert offline.due(30) == ["a"]
