"""Durable sessions survive broker restarts: the seed's quick start, with real clients and a
real `kill -9` of the broker process.

The session subscribes, goes away, messages are published while it is offline, the broker
is killed (or stopped) and started again on the same data directory, and the client comes
back without subscribing: every message arrives, in order, and Session Present is 1.
"""

import json
import random
import time
from collections.abc import Callable

import pytest
from paho.mqtt.packettypes import PacketTypes

from broker.mqtt.constants import PropertyId
from broker.mqtt.packets import Publish, Pubrec, Suback, Subscribe, Subscription
from tests.integration.clients import (
    PahoClient,
    api_client,
    http_json,
    props,
    publish_props,
    run_cli,
    scrape_metrics,
    unique,
    wait_offline,
    wait_until,
)
from tests.protocol.rawclient import RawClient
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

COUNT = 1000
EXPIRY = 3600


def publish_all(client: PahoClient, topic: str, payloads: list[bytes], qos: int) -> None:
    """Publishes without waiting per message, then waits for every acknowledgement."""
    infos = [client.client.publish(topic, payload, qos) for payload in payloads]
    for info in infos:
        info.wait_for_publish(30)
        assert info.is_published()


def subscribe_and_leave(paho_client, broker: BrokerProcess, client_id: str,
                        subscriptions: list[tuple[str, int]]) -> None:
    """A durable session subscribes and disconnects; returns once the broker shows it away."""
    sub = paho_client(client_id, port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    assert sub.subscribe(subscriptions) == [qos for _, qos in subscriptions]
    sub.disconnect()
    wait_offline(broker.ports["http"], client_id)


def wait_state_on_disk(broker: BrokerProcess) -> None:
    """Session changes (disconnect time, acknowledgements) reach the disk within a flush
    interval; a test that kills the broker right after one waits for it."""
    http = broker.ports["http"]
    wait_until(lambda: scrape_metrics(http)["mqtt_durable_state_writes_pending"] == 0,
               what="session state on disk")


def restart(broker: BrokerProcess, start_broker: Callable[..., BrokerProcess],
            how: str) -> BrokerProcess:
    if how == "kill":
        broker.kill()  # SIGKILL: nothing is flushed, nothing is closed
    else:
        assert broker.stop() == 0
    return start_broker(broker.data_dir)


@pytest.mark.parametrize("how", ["kill", "graceful"])
@pytest.mark.parametrize("qos", [1, 2])
def test_quick_start_offline_messages_survive_a_restart(
    paho_client, start_broker, how: str, qos: int
) -> None:
    broker = start_broker()
    subscribe_and_leave(paho_client, broker, "emqx_c", [("t/1", qos)])
    pub = paho_client(port=broker.tcp)
    sent = [f"message {n}".encode() for n in range(COUNT)]
    publish_all(pub, "t/1", sent, qos)

    broker = restart(broker, start_broker, how)

    # The dashboard view: the session is there, disconnected, before anyone connects.
    view = api_client(broker.ports["http"], "emqx_c")
    assert view is not None
    assert (view["connected"], view["durable"], view["subscriptions_cnt"]) == (False, True, 1)
    back = paho_client("emqx_c", port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    assert back.connack.session_present is True
    received = back.wait_messages(COUNT, timeout=60)
    assert [m.payload for m in received] == sent
    assert {m.qos for m in received} == {qos}
    # Exactly these: nothing more is on its way (a barrier round trip proves it).
    assert len(back.barrier()) == COUNT


def test_mqtt_311_clean_session_0_is_durable(paho_client, start_broker) -> None:
    broker = start_broker()
    sub = paho_client("c311", port=broker.tcp, version=4, clean_session=False)
    assert sub.subscribe("v311/t", 1) == [1]
    sub.disconnect()
    wait_offline(broker.ports["http"], "c311")
    pub = paho_client(port=broker.tcp, version=4)
    sent = [f"m{n}".encode() for n in range(200)]
    publish_all(pub, "v311/t", sent, 1)
    broker = restart(broker, start_broker, "kill")
    back = paho_client("c311", port=broker.tcp, version=4, clean_session=False)
    assert back.connack.session_present is True
    assert [m.payload for m in back.wait_messages(200)] == sent


def test_wildcard_subscription_gets_every_matching_topic_in_order(
    paho_client, start_broker
) -> None:
    broker = start_broker()
    subscribe_and_leave(paho_client, broker, "wild", [("metrics/+/cpu/#", 1)])
    pub = paho_client(port=broker.tcp)
    hosts = [f"host{n}" for n in range(20)]
    expected: dict[str, list[bytes]] = {}
    for round_ in range(10):
        for host in hosts:
            topic = f"metrics/{host}/cpu/core/{round_ % 3}"
            payload = f"{host}:{round_}".encode()
            expected.setdefault(topic, []).append(payload)
            pub.client.publish(topic, payload, 1)
    publish_all(pub, "metrics/host0/mem", [b"not matched"], 1)
    broker = restart(broker, start_broker, "kill")
    back = paho_client("wild", port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    received = back.wait_messages(200)
    got: dict[str, list[bytes]] = {}
    for message in received:
        got.setdefault(message.topic, []).append(message.payload)
    assert got == expected  # every topic complete and in its publish order
    assert len(back.barrier()) == 200


def test_kill_while_the_subscriber_is_mid_stream(paho_client, start_broker) -> None:
    """Unacknowledged deliveries come again with DUP after a kill; acknowledged ones not."""
    # An in-flight window of 20: then the 30th delivery proves the first 10 acknowledgements
    # were processed (with the default of 32 it could arrive before any of them).
    broker = start_broker(**{"mqtt.max_inflight": "20"})
    sub = paho_client("mid", port=broker.tcp, clean_start=False, session_expiry=EXPIRY,
                      manual_ack=True)
    sub.subscribe("mid/t", 1)
    pub = paho_client(port=broker.tcp)
    sent = [f"m{n:04d}".encode() for n in range(300)]
    publish_all(pub, "mid/t", sent, 1)
    first = sub.wait_messages(20)  # the in-flight window: nothing acknowledged yet
    for message in first[:10]:
        sub.ack(message.mid, 1)
    acked = {m.payload for m in first[:10]}
    sub.wait_messages(30)  # the window reopened: the broker has processed the acknowledgements
    # ... and written them: a kill within that flush interval would (legitimately, QoS 1)
    # deliver them again; this test checks that recorded acknowledgements are never resent.
    wait_state_on_disk(broker)
    broker = restart(broker, start_broker, "kill")
    sub.close()

    back = paho_client("mid", port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    assert back.connack.session_present is True
    rest = back.wait_messages(290, timeout=60)
    payloads = [m.payload for m in rest]
    assert not acked & set(payloads), "acknowledged messages were delivered again"
    assert payloads == [p for p in sent if p not in acked]
    assert all(m.dup for m in rest[:10])  # sent before the kill, not acknowledged


def test_session_expiry_is_honoured_across_a_restart(paho_client, start_broker) -> None:
    broker = start_broker()
    sub = paho_client("short", port=broker.tcp, clean_start=False, session_expiry=1)
    sub.subscribe("short/t", 1)
    sub.disconnect()
    wait_offline(broker.ports["http"], "short")
    wait_state_on_disk(broker)  # the disconnect time is what expiry counts from
    broker.kill()
    time.sleep(1.5)  # the node is down for longer than the session's expiry interval
    broker = start_broker(broker.data_dir)
    assert api_client(broker.ports["http"], "short") is None
    back = paho_client("short", port=broker.tcp, clean_start=False, session_expiry=60)
    assert back.connack.session_present is False


def test_storage_and_metrics_report_durable_sessions(paho_client, start_broker) -> None:
    broker = start_broker()
    subscribe_and_leave(paho_client, broker, unique("m"), [("dm/t", 1)])
    pub = paho_client(port=broker.tcp)
    publish_all(pub, "dm/t", [b"a", b"b", b"c"], 1)
    metrics = scrape_metrics(broker.ports["http"])
    assert metrics["mqtt_durable_messages_persisted_total"] == 3
    assert metrics["mqtt_durable_sessions_disconnected"] == 1
    storages = http_json(broker.ports["http"], "/api/v5/ds/storages")
    assert storages["databases"][0]["name"] == "messages"


def test_messages_are_stored_once_for_many_durable_subscribers(
    paho_client, start_broker
) -> None:
    broker = start_broker()
    for n in range(5):
        client = paho_client(f"many{n}", port=broker.tcp, clean_start=False,
                             session_expiry=EXPIRY)
        client.subscribe("many/t", 1)
        client.disconnect()
    pub = paho_client(port=broker.tcp)
    publish_all(pub, "many/t", [b"x"] * 10, 1)
    metrics = scrape_metrics(broker.ports["http"])
    assert metrics["mqtt_durable_messages_persisted_total"] == 10  # not 50
    for n in range(5):
        back = paho_client(f"many{n}", port=broker.tcp, clean_start=False,
                           session_expiry=EXPIRY)
        assert len(back.wait_messages(10)) == 10


def test_ctl_sessions_list_and_show_after_a_restart(paho_client, start_broker) -> None:
    broker = start_broker()
    subscribe_and_leave(paho_client, broker, "ctl-c", [("ctl/a", 1), ("ctl/+/b", 2)])
    wait_state_on_disk(broker)
    broker = restart(broker, start_broker, "kill")
    url = f"http://127.0.0.1:{broker.ports['http']}"

    listed = run_cli("ctl", "sessions", "list", "--url", url)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("ctl-c"))
    assert row.split()[1:3] == ["disconnected", "durable"]
    shown = run_cli("ctl", "sessions", "show", "ctl-c", "--url", url, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert sorted((s["topic"], s["qos"]) for s in detail["subscriptions"]) == [
        ("ctl/+/b", 2), ("ctl/a", 1)]
    missing = run_cli("ctl", "sessions", "show", "nobody", "--url", url)
    assert missing.returncode == 1 and "no session 'nobody'" in missing.stderr


def test_admin_cap_and_ttl_for_durable_sessions(paho_client, start_broker) -> None:
    broker = start_broker(**{
        "durable_sessions.max_session_expiry_interval": "1h",
        "durable_sessions.session_ttl": "1s",
        "durable_sessions.session_gc_interval": "200ms",
    })
    capped = paho_client("capped", port=broker.tcp, clean_start=False, session_expiry=86_400)
    assert capped.connack.prop("SessionExpiryInterval") == 3600
    forever = paho_client("forever", port=broker.tcp, clean_start=False,
                          session_expiry=0xFFFFFFFF)
    assert forever.connack.prop("SessionExpiryInterval") == 3600  # the cap applies too
    capped.disconnect()
    wait_offline(broker.ports["http"], "capped")
    assert api_client(broker.ports["http"], "capped") is not None


def test_session_ttl_ends_sessions_that_never_expire(paho_client, start_broker) -> None:
    broker = start_broker(**{
        "durable_sessions.session_ttl": "1s",
        "durable_sessions.session_gc_interval": "200ms",
    })
    client = paho_client("forever", port=broker.tcp, clean_start=False,
                         session_expiry=0xFFFFFFFF)
    client.subscribe("ttl/t", 1)
    client.disconnect()
    wait_offline(broker.ports["http"], "forever")
    wait_until(lambda: api_client(broker.ports["http"], "forever") is None,
               what="the garbage collector ending the session after its TTL")
    back = paho_client("forever", port=broker.tcp, clean_start=False,
                       session_expiry=0xFFFFFFFF)
    assert back.connack.session_present is False


def test_a_will_whose_delay_ran_out_while_the_node_was_down_fires_at_start_up(
    paho_client, start_broker
) -> None:
    broker = start_broker(**{"durable_sessions.heartbeat_interval": "100ms"})
    subscribe_and_leave(paho_client, broker, "watcher", [("wills/#", 1)])
    doomed = paho_client("doomed", port=broker.tcp, clean_start=False, session_expiry=EXPIRY,
                         will={"topic": "wills/doomed", "payload": b"gone", "qos": 1,
                               "properties": props(PacketTypes.WILLMESSAGE,
                                                   WillDelayInterval=1)})
    wait_state_on_disk(broker)  # the will is on disk
    broker.kill()  # the connection is lost with the node; the will is owed 1 s later
    doomed.wait_disconnected()
    time.sleep(1.5)  # the node stays down past the will delay
    broker = start_broker(broker.data_dir)
    back = paho_client("watcher", port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    (will,) = back.wait_messages(1)
    assert (will.topic, will.payload) == ("wills/doomed", b"gone")
    assert api_client(broker.ports["http"], "doomed")["connected"] is False  # session kept


def test_stored_messages_expire(paho_client, start_broker) -> None:
    broker = start_broker()
    subscribe_and_leave(paho_client, broker, "exp", [("exp/t", 1)])
    pub = paho_client(port=broker.tcp)
    pub.publish("exp/t", b"short", 1, properties=publish_props(MessageExpiryInterval=1))
    pub.publish("exp/t", b"long", 1, properties=publish_props(MessageExpiryInterval=100))
    pub.publish("exp/t", b"forever", 1)
    time.sleep(1.5)  # the first message's lifetime passes while the client is away
    back = paho_client("exp", port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    back.wait_messages(2)
    received = back.barrier()
    assert [m.payload for m in received] == [b"long", b"forever"]
    assert 97 <= received[0].prop("MessageExpiryInterval") <= 99  # the time remaining
    assert received[1].prop("MessageExpiryInterval") is None


def test_kills_at_random_moments_lose_no_acknowledged_message(paho_client, start_broker) -> None:
    """A publisher and a durable subscriber keep going while the broker is killed five
    times at random points: every message whose PUBACK the publisher got reaches the
    subscriber, and in publish order (redeliveries aside)."""
    rng = random.Random(20261121)  # fixed: a failure can be replayed
    broker = start_broker()
    subscribe_and_leave(paho_client, broker, "chaos-sub", [("chaos/t", 1)])
    acknowledged: set[bytes] = set()
    received: list[bytes] = []
    sequence = 0
    for _ in range(5):
        sub = paho_client("chaos-sub", port=broker.tcp, clean_start=False,
                          session_expiry=EXPIRY)
        pub = paho_client("chaos-pub", port=broker.tcp)
        sent = []
        for _ in range(rng.randint(100, 400)):
            payload = b"%06d" % sequence
            sequence += 1
            sent.append((payload, pub.client.publish("chaos/t", payload, 1)))
        kill_after = rng.randint(0, len(sent))
        wait_until(lambda sent=sent, n=kill_after: sum(i.is_published() for _, i in sent) >= n,
                   what=f"{kill_after} acknowledgements before the kill")
        broker.kill()
        acknowledged.update(payload for payload, info in sent if info.is_published())
        sub.wait_disconnected()
        pub.wait_disconnected()
        received.extend(m.payload for m in sub.messages)
        broker = start_broker(broker.data_dir)

    back = paho_client("chaos-sub", port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    assert back.connack.session_present is True
    wait_until(lambda: acknowledged <= set(received) | {m.payload for m in back.messages},
               timeout=30, what="every acknowledged message delivered")
    received.extend(m.payload for m in back.messages)
    first_seen = list(dict.fromkeys(received))
    assert first_seen == sorted(first_seen), "messages arrived out of publish order"
    assert len(acknowledged) > 100  # the kills did not all come before any publishing


def test_a_replayed_batch_keeps_its_packet_identifiers(paho_client, start_broker) -> None:
    """A batch record holds only its read window: after a kill -9 the session derives from
    the stored messages which delivery had which packet identifier. Its own messages (No
    Local), QoS 0 messages and one that expired before it was sent are in that window and
    must not shift the identifiers of the others."""
    # One shard, so every publisher's messages share one stream (shards go by publisher).
    one_shard = {"durable_storage.messages.n_shards": "1"}
    broker = start_broker(**one_shard)
    # Its own will: published by the session's client ID while the client is away, so it is
    # stored inside the window of the batch that is read when the client is back.
    sub = paho_client("derive", port=broker.tcp, clean_start=False, session_expiry=EXPIRY,
                      will={"topic": "derive/t", "payload": b"own", "qos": 1})
    assert sub.subscribe("derive/t", 1, no_local=True) == [1]
    sub.kill()
    wait_offline(broker.ports["http"], "derive")
    pub = paho_client(port=broker.tcp)
    pub.publish("derive/t", b"a", 1)
    pub.publish("derive/t", b"expires", 1, properties=publish_props(MessageExpiryInterval=1))
    pub.publish("derive/t", b"b", 0)
    pub.publish("derive/t", b"c", 1)
    pub.publish("derive/t", b"d", 1)
    time.sleep(1.5)  # the second message's lifetime passes while the client is away

    sub = paho_client("derive", port=broker.tcp, clean_start=False, session_expiry=EXPIRY,
                      manual_ack=True)
    first = sub.wait_messages(4)
    assert [m.payload for m in first] == [b"a", b"b", b"c", b"d"]
    sub.ack(first[0].mid, 1)
    sub.barrier()  # the acknowledgement of "a" was read ...
    wait_state_on_disk(broker)  # ... and written
    broker.kill()
    broker = start_broker(broker.data_dir, **one_shard)
    sub.close()

    back = paho_client("derive", port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
    assert back.connack.session_present is True
    again = back.wait_messages(2)
    assert back.barrier() == again  # nothing else: not "a", not QoS 0 "b", not the expired one
    assert [(m.payload, m.mid, m.dup) for m in again] == [
        (m.payload, m.mid, True) for m in first if m.payload in (b"c", b"d")
    ]


def test_a_message_too_large_for_the_client_is_done_with_not_left_pending(
    paho_client, start_broker
) -> None:
    """MQTT-3.1.2-25: a packet larger than the client's Maximum Packet Size is discarded. For
    a durable session that counts as done, so its batch completes and the checkpoint moves on
    instead of holding the message as unacknowledged forever."""
    broker = start_broker()
    http = broker.ports["http"]
    sub = paho_client(unique("small"), port=broker.tcp, clean_start=False, session_expiry=EXPIRY,
                      properties=props(PacketTypes.CONNECT, MaximumPacketSize=128))
    sub.subscribe("dl/t", 1)
    pub = paho_client(port=broker.tcp)
    publish_all(pub, "dl/t", [b"fits", b"x" * 200, b"fits too"], 1)
    assert [m.payload for m in sub.wait_messages(2)] == [b"fits", b"fits too"]
    wait_until(lambda: scrape_metrics(http)["mqtt_durable_checkpoint_lag"] == 0,
               what="every delivery done with")


def test_a_qos2_delivery_the_client_refuses_is_done_with_not_left_pending(
    paho_client, start_broker
) -> None:
    """A PUBREC with a failure code ends the flow (MQTT 5.0 section 4.3.3): the durable
    session's batch completes, as for an acknowledged delivery, and it is never resent."""
    broker = start_broker()
    http = broker.ports["http"]
    sub = RawClient(broker.tcp)
    try:
        sub.connect(unique("refuser"), clean_start=False,
                    properties={PropertyId.SESSION_EXPIRY_INTERVAL: EXPIRY})
        sub.send(Subscribe(1, [Subscription("dr/t", 2)]))
        assert isinstance(sub.recv(), Suback)
        publish_all(paho_client(port=broker.tcp), "dr/t", [b"refused"], 2)
        got = sub.recv()
        assert isinstance(got, Publish) and got.payload == b"refused"
        assert got.packet_id is not None
        sub.send(Pubrec(got.packet_id, 0x80))
        wait_until(lambda: scrape_metrics(http)["mqtt_durable_checkpoint_lag"] == 0,
                   what="the refused delivery done with")
    finally:
        sub.close()
