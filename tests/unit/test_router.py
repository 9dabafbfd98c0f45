from broker.routing.router import Router
from broker.session.message import Message
from broker.session.session import SubscriptionOptions


def online(_client_id: str) -> bool:
    return True


def test_overlapping_subscriptions_collapse_to_max_qos_and_all_identifiers() -> None:
    router = Router()
    router.subscribe("c1", "a/+", SubscriptionOptions(qos=0, identifier=1))
    router.subscribe("c1", "a/#", SubscriptionOptions(qos=2, identifier=7))
    deliveries = router.route(Message("a/b", b"x", qos=1), online)
    assert list(deliveries) == ["c1"]
    assert deliveries["c1"].qos == 1
    assert sorted(deliveries["c1"].subscription_ids) == [1, 7]


def test_no_local_skips_the_publisher_only() -> None:
    router = Router()
    router.subscribe("me", "t", SubscriptionOptions(qos=0, no_local=True))
    router.subscribe("you", "t", SubscriptionOptions(qos=0, no_local=True))
    assert list(router.route(Message("t", b"", publisher="me"), online)) == ["you"]


def test_retain_flag_kept_only_with_retain_as_published() -> None:
    router = Router()
    router.subscribe("rap", "t", SubscriptionOptions(qos=0, retain_as_published=True))
    router.subscribe("plain", "t", SubscriptionOptions(qos=0))
    deliveries = router.route(Message("t", b"x", retain=True), online)
    assert deliveries["rap"].retain is True
    assert deliveries["plain"].retain is False


def test_shared_group_round_robin_prefers_online_members() -> None:
    router = Router()
    for member in ("m1", "m2", "m3"):
        router.subscribe(member, "s/t", SubscriptionOptions(qos=1, share_group="g"))
    router.subscribe("other", "s/t", SubscriptionOptions(qos=1, share_group="h"))
    picked = [
        sorted(router.route(Message("s/t", b"x", qos=1), lambda c: c != "m2"))
        for _ in range(4)
    ]
    assert all("other" in p and len(p) == 2 for p in picked)
    members = [next(c for c in p if c != "other") for p in picked]
    assert "m2" not in members
    assert set(members) == {"m1", "m3"}


def test_unsubscribe_stops_delivery_and_cache_is_invalidated() -> None:
    router = Router()
    router.subscribe("c", "x/#", SubscriptionOptions(qos=0))
    assert router.route(Message("x/y", b""), online)
    assert router.unsubscribe("c", "x/#", None)
    assert router.route(Message("x/y", b""), online) == {}
