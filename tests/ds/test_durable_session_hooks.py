"""A durable session's hooks record what the packet handlers change: subscriptions (read
from Durable Storage, not routed, unless shared) and the client's QoS 2 messages awaiting
PUBREL, whose record is on disk before the PUBREC may leave."""

import pytest

from broker.session.durable import records as r
from broker.session.durable.groups import READY, GroupManager
from broker.session.durable.session import DurableContext, DurableSession
from broker.session.durable.store import SessionStore
from broker.session.session import SubscriptionOptions
from broker.stats import Stats


@pytest.fixture
def context(open_storage) -> DurableContext:
    storage = open_storage()
    return DurableContext(storage, SessionStore(storage), Stats(), 100)


@pytest.fixture
def store(context: DurableContext) -> SessionStore:
    return context.store


@pytest.fixture
async def session(context: DurableContext) -> DurableSession:
    context.store.write_soon([(r.meta_key("dev"), r.Meta(3600, 5, True, None).to_bytes())])
    return DurableSession("dev", 3600, context)


async def test_a_subscription_is_stored_and_read_from_storage(
    session: DurableSession, store: SessionStore,
) -> None:
    options = SubscriptionOptions(2)
    assert session.subscribe("a/#", options) is True
    await store.settle()
    stored = store.load("dev", subscriptions=True)
    assert stored is not None and stored.subscriptions["a/#"][0] == options
    assert session.unsubscribe("a/#") is True
    await store.settle()
    stored = store.load("dev", subscriptions=True)
    assert stored is not None and stored.subscriptions == {} and session.subscriptions == {}


async def test_a_shared_subscription_is_part_of_the_stored_session(
    session: DurableSession, store: SessionStore,
) -> None:
    """MQTT 5.0 section 3.2.2.1.1: Session Present 1 restores every subscription, a
    durable group member's included."""
    options = SubscriptionOptions(1, share_group="g")
    assert session.subscribe("$share/g/a", options) is True
    await store.settle()
    stored = store.load("dev", subscriptions=True)
    assert stored is not None and list(stored.subscriptions) == ["$share/g/a"]
    assert session.unsubscribe("$share/g/a") is True
    await store.settle()
    stored = store.load("dev", subscriptions=True)
    assert stored is not None and stored.subscriptions == {} and session.subscriptions == {}


async def test_an_incoming_qos2_message_is_remembered_until_its_pubrel(
    session: DurableSession, store: SessionStore,
) -> None:
    remembered = session.rel_awaited(9)
    assert remembered is not None  # the PUBREC waits for it
    await remembered
    stored = store.load("dev")
    assert stored is not None and stored.awaiting_rel == {9}
    assert session.rel_arrived(9) is True
    assert session.rel_arrived(9) is False
    await store.settle()
    stored = store.load("dev")
    assert stored is not None and stored.awaiting_rel == set()


async def test_before_the_cluster_runs_durable_groups_a_shared_subscription_is_routed(
    context: DurableContext, session: DurableSession, store: SessionStore,
) -> None:
    """Cluster version 0 (a member on release 0.1.0, whose replicas do not fence a group's
    writes): routed live and not stored, as 0.1.0 did, and so until it is unsubscribed;
    one made after the rise is a group's."""
    allowed = False
    groups = GroupManager(context.ds, store, Stats(), {}, lambda _: READY, True)
    groups.allowed = lambda: allowed
    context.groups = groups
    options = SubscriptionOptions(1, share_group="g")
    assert session.subscribe("$share/g/a", options) is False
    assert session.is_routed("$share/g/a") and not session.is_routed("b/#")
    await store.settle()
    stored = store.load("dev", subscriptions=True)
    assert stored is not None and stored.subscriptions == {} and groups.groups == {}
    allowed = True
    assert session.subscribe("$share/g/a", options) is False  # still routed
    assert session.subscribe("$share/g/b", options) is True
    assert list(groups.groups) == ["$share/g/b"]
    assert session.unsubscribe("$share/g/a") is False
    assert not session.is_routed("$share/g/a") and "$share/g/a" not in session.subscriptions
    await store.settle()
    stored = store.load("dev", subscriptions=True)
    assert stored is not None and list(stored.subscriptions) == ["$share/g/b"]
