"""Named streams and `$stream/<name>` replay (EMQX 6.1's MQTT Streams) with real clients
against real broker processes: stored from the stream's creation, replayed from an offset,
on into live delivery with no gap and no duplicate, within the client's Receive Maximum,
across a kill -9 of the broker; bad requests get their SUBACK reason codes."""

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes

from tests.integration.clients import (
    GmqttClient,
    PahoClient,
    api_client,
    http_json,
    http_send,
    props,
    scrape_metrics,
    unique,
    wait_until,
)
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

EXPIRY = 3600
BATCH = 100  # durable_sessions.batch_size's default
AUTO = {"streams.auto_create": "true"}


def create(broker: BrokerProcess, name: str, topic_filter: str, status: int = 201) -> Any:
    code, body = http_send(broker.ports["http"], "POST", "/api/v5/message_streams",
                           {"name": name, "topic_filter": topic_filter})
    assert code == status, body
    return body


def offset(value: str) -> list[tuple[str, str]]:
    return [("stream-offset", value)]


def durable(clients: list[PahoClient], broker: BrokerProcess, client_id: str | None = None,
            *, clean_start: bool = True, manual_ack: bool = False,
            receive_maximum: int | None = None) -> PahoClient:
    client = PahoClient(broker.tcp, client_id or unique("reader"), manual_ack=manual_ack)
    clients.append(client)
    properties = None
    if receive_maximum is not None:
        properties = props(PacketTypes.CONNECT, ReceiveMaximum=receive_maximum)
    client.connect(clean_start=clean_start, session_expiry=EXPIRY, properties=properties)
    return client


def publisher(clients: list[PahoClient], broker: BrokerProcess) -> PahoClient:
    client = PahoClient(broker.tcp, unique("pub"))
    clients.append(client)
    client.connect()
    return client


def publish_all(client: PahoClient, topic: str, payloads: list[bytes]) -> None:
    """QoS 1 without waiting per message; returns once every one is acknowledged (stored)."""
    infos = [client.client.publish(topic, payload, 1) for payload in payloads]
    for info in infos:
        info.wait_for_publish(30)
        assert info.is_published()


def numbers(count: int, start: int = 0) -> list[bytes]:
    return [str(i).encode() for i in range(start, start + count)]


def test_a_stream_replays_from_earliest_a_timestamp_and_latest_then_goes_on_live(
        broker: BrokerProcess, clients: list[PahoClient]) -> None:
    topic = unique("sensors").replace("-", "/")
    pub = publisher(clients, broker)
    pub.publish(f"{topic}/before", b"not stored: no stream yet", 1)
    create(broker, "plant", f"{topic}/#")
    publish_all(pub, f"{topic}/a", numbers(10))
    cut = time.time_ns() // 1000
    publish_all(pub, f"{topic}/a", numbers(20, 10))

    earliest = durable(clients, broker)
    assert earliest.subscribe("$stream/plant", 1, user_properties=offset("earliest")) == [1]
    assert [m.payload for m in earliest.wait_messages(30)] == numbers(30)
    assert {m.topic for m in earliest.messages} == {f"{topic}/a"}  # the published topic

    since = durable(clients, broker)
    assert since.subscribe("$stream/plant", 1, user_properties=offset(str(cut))) == [1]
    assert [m.payload for m in since.wait_messages(20)] == numbers(20, 10)

    latest = durable(clients, broker)
    assert latest.subscribe("$stream/plant", 1, user_properties=offset("latest")) == [1]
    publish_all(pub, f"{topic}/a", [b"live"])
    for reader, count in ((earliest, 31), (since, 21), (latest, 1)):
        received = reader.wait_messages(count)
        assert received[-1].payload == b"live"
        assert [m.payload for m in reader.barrier()] == [m.payload for m in received]


def test_the_seam_between_replay_and_live_has_no_gap_and_no_duplicate(
        broker: BrokerProcess, clients: list[PahoClient]) -> None:
    """A publisher goes on publishing while the subscriber replays from earliest: every
    message arrives exactly once, in the order it was published."""
    topic = unique("seam").replace("-", "/")
    create(broker, "seam", topic)
    pub = publisher(clients, broker)
    total = 3000
    publish_all(pub, topic, numbers(1000))
    rest = threading.Thread(target=publish_all, args=(pub, topic, numbers(total - 1000, 1000)))
    rest.start()
    try:
        reader = durable(clients, broker)
        assert reader.subscribe("$stream/seam", 1, user_properties=offset("earliest")) == [1]
    finally:
        rest.join()
    received = reader.wait_messages(total, timeout=60)
    assert [m.payload for m in received] == numbers(total)
    assert len(reader.barrier()) == total


def test_a_replay_stays_within_receive_maximum_and_holds_a_bounded_backlog(
        broker: BrokerProcess, clients: list[PahoClient]) -> None:
    """20,000 stored messages, a client that acknowledges nothing: the broker has its
    Receive Maximum in flight and holds at most a few batches more, whatever is stored."""
    topic = unique("window").replace("-", "/")
    create(broker, "window", topic)
    publish_all(publisher(clients, broker), topic, numbers(20_000))
    http = broker.ports["http"]
    reader = durable(clients, broker, manual_ack=True, receive_maximum=7)
    assert reader.subscribe("$stream/window", 1, user_properties=offset("earliest")) == [1]
    reader.wait_messages(7)
    view: dict[str, Any] = {}

    def read_ahead_stopped() -> bool:
        view.update(api_client(http, reader.client_id) or {})
        return view.get("inflight_cnt") == 7 and view.get("mqueue_len", 0) >= BATCH

    wait_until(read_ahead_stopped, what="the reader's read-ahead")
    assert len(reader.barrier()) == 7  # nothing beyond the window reached the client
    view = api_client(http, reader.client_id) or {}
    assert view["inflight_cnt"] == 7
    assert view["mqueue_len"] <= 3 * BATCH  # read ahead: bounded, not 20,000
    for message in reader.messages[:3]:
        reader.ack(message.mid, 1)
    received = reader.wait_messages(10)
    assert [m.payload for m in received] == numbers(10)
    assert len(reader.barrier()) == 10


def test_a_replay_resumes_where_it_was_after_kill_9(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient]) -> None:
    broker = start_broker()
    topic = unique("resume").replace("-", "/")
    create(broker, "resume", topic)
    publish_all(publisher(clients, broker), topic, numbers(500))
    client_id = unique("resumer")
    reader = durable(clients, broker, client_id, manual_ack=True, receive_maximum=10)
    assert reader.subscribe("$stream/resume", 1, user_properties=offset("earliest")) == [1]
    first = reader.wait_messages(10)
    for message in first:
        reader.ack(message.mid, 1)
    second = reader.wait_messages(20)[10:]
    assert [m.payload for m in second] == numbers(10, 10)
    wait_until(lambda: scrape_metrics(broker.ports["http"])[
        "mqtt_durable_state_writes_pending"] == 0, what="acknowledgements on disk")
    broker.kill()
    reader.close()
    broker = start_broker(broker.data_dir)
    again = PahoClient(broker.tcp, client_id)
    clients.append(again)
    assert again.connect(clean_start=False, session_expiry=EXPIRY).session_present
    received = again.wait_messages(490, timeout=60)
    # The ten unacknowledged ones come again (DUP), then the rest; nothing acknowledged.
    assert [m.payload for m in received] == numbers(490, 10)
    assert all(m.dup for m in received[:10])
    assert len(again.barrier()) == 490


def test_a_resubscribe_does_not_rewind_and_an_unsubscribe_forgets(
        broker: BrokerProcess, clients: list[PahoClient]) -> None:
    topic = unique("again").replace("-", "/")
    create(broker, "again", topic)
    pub = publisher(clients, broker)
    publish_all(pub, topic, numbers(5))
    reader = durable(clients, broker)
    assert reader.subscribe("$stream/again", 1, user_properties=offset("earliest")) == [1]
    reader.wait_messages(5)
    assert reader.subscribe("$stream/again", 1, user_properties=offset("earliest")) == [1]
    assert len(reader.barrier()) == 5
    reader.unsubscribe("$stream/again")
    assert reader.subscribe("$stream/again", 1, user_properties=offset("earliest")) == [1]
    assert [m.payload for m in reader.wait_messages(10)[5:]] == numbers(5)


def test_bad_requests_get_their_suback_reason_codes(
        broker: BrokerProcess, clients: list[PahoClient]) -> None:
    topic = unique("bad").replace("-", "/")
    create(broker, "bad", f"{topic}/#")
    reader = durable(clients, broker)
    cases = [
        ("$stream/bad", offset("yesterday"), 0x83, "stream-offset 'yesterday'"),
        ("$stream/bad", offset("-5"), 0x83, "stream-offset '-5'"),
        ("$stream/missing", offset("earliest"), 0x8F, "no stream named 'missing'"),
        (f"$stream/bad/{topic}/x", offset("earliest"), 0x8F, "has topic filter"),
        (f"$stream/new/{topic}", offset("earliest"), 0x8F, "no stream named 'new'"),
    ]
    for key, user_properties, code, reason in cases:
        assert reader.subscribe(key, 1, user_properties=user_properties) == [code], key
        assert reason in (reader.suback_reason or ""), reader.suback_reason
    # Both forms of a stream's subscription, in one SUBSCRIBE with a bad one.
    assert reader.subscribe([("$stream/bad", 1), (f"$stream/bad/{topic}/#", 1),
                             ("$stream/nope", 1)]) == [1, 1, 0x8F]
    memory = PahoClient(broker.tcp, unique("memory"))
    clients.append(memory)
    memory.connect()
    assert memory.subscribe("$stream/bad", 1) == [0x83]
    assert "durable session" in (memory.suback_reason or "")
    assert reader.subscribe(f"{topic}/plain", 1) == [1] and reader.suback_reason is None


def test_mqtt_3_1_1_replays_from_earliest(
        broker: BrokerProcess, clients: list[PahoClient]) -> None:
    """A 3.1.1 client cannot send `stream-offset`: its subscription starts at earliest, a
    refusal is 0x80."""
    topic = unique("v3").replace("-", "/")
    create(broker, "v3", topic)
    publish_all(publisher(clients, broker), topic, numbers(5))
    reader = PahoClient(broker.tcp, unique("v3reader"), version=4, clean_session=False)
    clients.append(reader)
    reader.connect()
    assert reader.subscribe([("$stream/v3", 1), ("$stream/none", 1)]) == [1, 0x80]
    assert [m.payload for m in reader.wait_messages(5)] == numbers(5)


async def test_gmqtt_replays_and_auto_creates(
        start_broker: Callable[..., BrokerProcess]) -> None:
    """With `streams.auto_create`, `$stream/<name>/<filter>` creates the stream; what is
    published from then on is replayed to a later subscriber from earliest."""
    broker = start_broker(**AUTO)
    topic = unique("auto").replace("-", "/")
    first = GmqttClient(broker.tcp, unique("g1"), clean=False, session_expiry_interval=EXPIRY)
    later = GmqttClient(broker.tcp, unique("g2"), clean=False, session_expiry_interval=EXPIRY)
    try:
        await first.connect()
        assert await first.subscribe(f"$stream/auto/{topic}/#", 1) == (1,)
        assert http_json(broker.ports["http"], "/api/v5/message_streams/auto")[
            "topic_filter"] == f"{topic}/#"
        for i in range(5):
            first.publish(f"{topic}/{i}", str(i).encode(), qos=1)
        await first.wait_messages(5)
        await later.connect()
        assert await later.subscribe("$stream/auto", 1,
                                     user_property=offset("earliest")) == (1,)
        received = await later.wait_messages(5)
        assert sorted(m.payload for m in received) == numbers(5)
    finally:
        await first.close()
        await later.close()


def test_streams_over_http_survive_a_restart(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient]) -> None:
    broker = start_broker()
    http = broker.ports["http"]
    topic = unique("api").replace("-", "/")
    view = create(broker, "api.one", f"{topic}/#")
    assert view["name"] == "api.one" and view["topic_filter"] == f"{topic}/#"
    assert create(broker, "api.one", f"{topic}/#", status=200) == view  # the same again
    assert create(broker, "api.one", f"{topic}/x", status=409)["code"] == "CONFLICT"
    assert create(broker, "bad name", "a", status=400)["code"] == "BAD_REQUEST"
    assert create(broker, "shared", "$share/g/a", status=400)["code"] == "BAD_REQUEST"
    assert create(broker, "gone", f"{topic}/gone") is not None
    assert http_send(http, "DELETE", "/api/v5/message_streams/gone") == (204, None)
    assert http_send(http, "DELETE", "/api/v5/message_streams/gone")[0] == 404
    publish_all(publisher(clients, broker), f"{topic}/kept", [b"stored"])
    broker.stop()
    broker = start_broker(broker.data_dir)
    listed = http_json(broker.ports["http"], "/api/v5/message_streams")["data"]
    assert listed == [view]
    reader = durable(clients, broker)
    assert reader.subscribe("$stream/api.one", 1, user_properties=offset("earliest")) == [1]
    assert reader.wait_messages(1)[0].payload == b"stored"


def test_the_readme_s_mosquitto_sub_replays_a_stream(
        broker: BrokerProcess, clients: list[PahoClient], mosquitto_sub) -> None:
    """README, Operations: `mosquitto_sub -V mqttv5 -c -x 3600 -t '$stream/plant' -D
    subscribe user-property stream-offset earliest`."""
    topic = unique("readme").replace("-", "/")
    create(broker, "readme", f"{topic}/#")
    publish_all(publisher(clients, broker), f"{topic}/t1", numbers(100, 1))
    sub = mosquitto_sub(broker.tcp, ["$stream/readme"], version="mqttv5", qos=1, extra=[
        "-i", unique("replay"), "-c", "-x", "3600",
        "-D", "subscribe", "user-property", "stream-offset", "earliest"])
    assert [m.payload.encode() for m in sub.wait_messages(100)] == numbers(100, 1)


def test_subscribing_to_a_stream_is_authorized_on_its_topic_filter(
        start_broker: Callable[..., BrokerProcess], clients: list[PahoClient],
        tmp_path: Path) -> None:
    """A client may replay a stream only if it may subscribe to the stream's filter: the ACL
    is checked on `public/#` or `secret/#`, not on `$stream/...`."""
    acl = tmp_path / "acl"
    acl.write_text("topic read public/#\n")  # anonymous clients: public/# only
    broker = start_broker(**{"authorization.acl_file": str(acl)})
    create(broker, "open", "public/#")
    create(broker, "closed", "secret/#")
    reader = durable(clients, broker)
    assert reader.subscribe([("$stream/open", 1), ("$stream/closed", 1),
                             ("$stream/closed/secret/#", 1)]) == [1, 0x87, 0x87]


def test_a_stream_subscription_gets_no_retained_messages(
        broker: BrokerProcess, clients: list[PahoClient]) -> None:
    """Its history is the replay: from `latest`, a topic's retained message stays away."""
    topic = unique("kept").replace("-", "/")
    create(broker, "kept", f"{topic}/#")
    pub = publisher(clients, broker)
    pub.publish(f"{topic}/state", b"retained", 1, retain=True)
    reader = durable(clients, broker)
    assert reader.subscribe("$stream/kept", 1, user_properties=offset("latest")) == [1]
    plain = durable(clients, broker)
    assert plain.subscribe(f"{topic}/#", 1) == [1]
    assert plain.wait_messages(1)[0].retain  # the broker has it to give
    assert reader.barrier() == []
