"""Which durable sessions the `sessions` group's leader ends for nodes that are gone."""

from broker.mqtt.constants import MAX_UINT32
from broker.session.durable.orphans import expired_orphans
from broker.session.durable.records import Meta

NOW = 10_000.0


def meta(site: str, expiry: int, connected: bool = False,
         disconnected_at: float | None = None) -> Meta:
    return Meta(expiry, 5, connected, disconnected_at, None, site, 1)


def orphans(metas: dict[str, Meta], up: set[str], heartbeats: dict[str, float] | None = None,
            ttl: float = 0.0) -> list[str]:
    return expired_orphans(metas.items(), (heartbeats or {}).get, up.__contains__, NOW, ttl)


def test_a_down_node_s_session_ends_once_expired_from_when_its_client_left() -> None:
    metas = {"gone": meta("B", 60, disconnected_at=NOW - 61),
             "young": meta("B", 60, disconnected_at=NOW - 59)}
    assert orphans(metas, up={"A"}) == ["gone"]


def test_sessions_of_nodes_that_are_up_are_theirs_to_end() -> None:
    assert orphans({"c": meta("A", 60, disconnected_at=NOW - 600)}, up={"A"}) == []


def test_a_session_connected_when_its_node_died_counts_from_the_last_heartbeat() -> None:
    metas = {"c": meta("B", 60, connected=True)}
    assert orphans(metas, up={"A"}, heartbeats={"B": NOW - 61}) == ["c"]
    assert orphans(metas, up={"A"}, heartbeats={"B": NOW - 30}) == []
    assert orphans(metas, up={"A"}) == []  # no heartbeat of B at all: nothing to count from


def test_a_session_that_never_expires_is_kept_for_the_ttl() -> None:
    metas = {"c": meta("B", MAX_UINT32, disconnected_at=NOW - 3600)}
    assert orphans(metas, up={"A"}) == []
    assert orphans(metas, up={"A"}, ttl=1800) == ["c"]


def test_a_session_from_before_replication_has_no_node_to_be_gone() -> None:
    assert orphans({"c": meta("", 60, disconnected_at=0.0)}, up={"A"}) == []
