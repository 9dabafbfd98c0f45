"""gmqtt (asyncio client) against the real broker: both versions, v5 properties, and the
broker's own Topic Aliases towards a client that allows them (paho never asks for those)."""

import asyncio

import pytest

from tests.integration.clients import BOTH, unique, wait_offline

pytestmark = pytest.mark.integration


@BOTH
async def test_connect(gmqtt_client, version) -> None:
    client = await gmqtt_client(version=version)
    session_present, reason, properties = client.connack
    assert (session_present, reason) == (0, 0)
    if version == 5:
        assert properties["receive_maximum"] == [32]
        assert properties["topic_alias_maximum"] == [65535]


@BOTH
@pytest.mark.parametrize("qos", [0, 1, 2])
async def test_pub_sub_in_order(gmqtt_client, topic, version, qos) -> None:
    sub = await gmqtt_client(version=version)
    assert await sub.subscribe(f"{topic}/g", qos) == (qos,)
    pub = await gmqtt_client(version=version)
    sent = [f"g{i}".encode() for i in range(25)] + [bytes(range(256)), b""]
    for payload in sent:
        pub.publish(f"{topic}/g", payload, qos)
    received = await sub.wait_messages(len(sent))
    assert [m.payload for m in received] == sent
    assert {(m.topic, m.qos, m.retain) for m in received} == {(f"{topic}/g", qos, False)}
    assert len(await sub.barrier()) == len(sent)


async def test_v5_properties_round_trip(gmqtt_client, topic) -> None:
    sub = await gmqtt_client()
    await sub.subscribe(f"{topic}/p", 1, subscription_identifier=99)
    pub = await gmqtt_client()
    user = [("k", "1"), ("k", "2"), ("z", "last")]
    pub.publish(f"{topic}/p", b"{}", 1, content_type="application/json",
                user_property=user, response_topic=f"{topic}/reply",
                correlation_data=b"\x01\x02", message_expiry_interval=90)
    (message,) = await sub.wait_messages(1)
    props = message.properties
    assert props["content_type"] == ["application/json"]
    assert props["user_property"] == user
    assert props["response_topic"] == [f"{topic}/reply"]
    assert props["correlation_data"] == [b"\x01\x02"]
    assert props["subscription_identifier"] == [99]
    assert 85 <= props["message_expiry_interval"][0] <= 90


async def test_v5_broker_uses_topic_aliases_the_client_allows(gmqtt_client, topic) -> None:
    sub = await gmqtt_client(topic_alias_maximum=2)
    await sub.subscribe(f"{topic}/#", 1)
    pub = await gmqtt_client()
    order = ["a", "b", "a", "c", "b", "c", "a"]
    for n, name in enumerate(order):
        pub.publish(f"{topic}/{name}", f"{name}{n}".encode(), 1)
    received = await sub.wait_messages(len(order))
    # gmqtt resolves aliases; a broker that sent an unknown alias would lose the message.
    assert [(m.topic, m.payload) for m in received] == [
        (f"{topic}/{name}", f"{name}{n}".encode()) for n, name in enumerate(order)]
    aliases = {m.topic: m.properties.get("topic_alias") for m in received}
    # Two aliases allowed: the first two topics get them, the third is always sent in full.
    assert aliases == {f"{topic}/a": [1], f"{topic}/b": [2], f"{topic}/c": None}


async def test_v5_no_topic_aliases_unless_allowed(gmqtt_client, topic) -> None:
    sub = await gmqtt_client()
    await sub.subscribe(f"{topic}/#", 0)
    pub = await gmqtt_client()
    for n in range(3):
        pub.publish(f"{topic}/same", f"{n}".encode(), 0)
    received = await sub.wait_messages(3)
    assert all("topic_alias" not in m.properties for m in received)


@BOTH
async def test_retained_message(gmqtt_client, topic, version) -> None:
    pub = await gmqtt_client(version=version)
    pub.publish(f"{topic}/r", b"kept", 1, retain=True)
    live = await gmqtt_client(version=version)
    await live.subscribe(f"{topic}/marker", 1)
    pub.publish(f"{topic}/marker", b"published after the retained one", 1)
    await live.wait_messages(1)  # same publisher, so the retained message is stored by now
    late = await gmqtt_client(version=version)
    await late.subscribe(f"{topic}/r", 1)
    (message,) = await late.wait_messages(1)
    assert (message.payload, message.retain) == (b"kept", True)


async def test_v5_no_local_and_retain_handling(gmqtt_client, topic) -> None:
    client = await gmqtt_client()
    client.publish(f"{topic}/own", b"retained", 1, retain=True)
    watcher = await gmqtt_client()
    await watcher.subscribe(f"{topic}/own", 1, retain_handling_options=2)
    await client.subscribe(f"{topic}/own", 1, no_local=True, retain_handling_options=2)
    client.publish(f"{topic}/own", b"live", 1)
    (seen,) = await watcher.wait_messages(1)
    assert seen.payload == b"live"  # retain handling 2: the retained one was not sent
    assert await client.barrier() == []  # no local: not even its own live message


async def test_v5_persistent_session(gmqtt_client, shared_broker, topic) -> None:
    client_id = unique("gpersist")
    first = await gmqtt_client(client_id, clean=True, session_expiry_interval=60)
    await first.subscribe(f"{topic}/s", 1)
    await first.close()
    # Off the event loop: the HTTP poll blocks.
    await asyncio.to_thread(wait_offline, shared_broker.ports["http"], client_id)
    pub = await gmqtt_client()
    watcher = await gmqtt_client()
    await watcher.subscribe(f"{topic}/s", 1)
    for n in range(3):
        pub.publish(f"{topic}/s", f"offline {n}".encode(), 1)
    await watcher.wait_messages(3)  # routed, so queued for the offline session as well
    back = await gmqtt_client(client_id, clean=False, session_expiry_interval=60)
    assert back.connack[0] == 1  # session present
    received = await back.wait_messages(3)
    assert [m.payload for m in received] == [b"offline 0", b"offline 1", b"offline 2"]
