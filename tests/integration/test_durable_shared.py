"""Durable shared subscriptions on one node: a consumer group of durable sessions keeps its
subscription and every acknowledged job through kill -9 and SIGTERM, each job reaching one
worker (the trials of the issue that made them first-class, with real paho clients and a
real broker process).
"""

import zlib
from collections import Counter
from collections.abc import Callable

import pytest
from paho.mqtt.packettypes import PacketTypes

from tests.integration.clients import (
    MosquittoSub,
    PahoClient,
    http_json,
    mosquitto_pub,
    props,
    unique,
    wait_offline,
    wait_until,
)
from tests.integration.test_durable_sessions import publish_all, restart
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

EXPIRY = 3600
JOBS = 500
SHARE = "$share/workers/jobs/#"


def publisher_ids(n_shards: int = 16) -> list[str]:
    """One publisher client ID per shard of the messages database (a publisher's messages
    live in shard crc32(client ID) mod n_shards), so the jobs cover every shard."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < n_shards:
        client_id = f"pub-{n}"
        found.setdefault(zlib.crc32(client_id.encode()) % n_shards, client_id)
        n += 1
    return [found[shard] for shard in range(n_shards)]


def publish_jobs(paho_client: Callable[..., PahoClient], broker: BrokerProcess,
                 count: int, tag: str = "job", qos: int = 1) -> list[bytes]:
    """`count` jobs from a publisher per shard, every one acknowledged."""
    sent: list[bytes] = []
    publishers = publisher_ids()
    for index, client_id in enumerate(publishers):
        pub = paho_client(client_id, port=broker.tcp)
        payloads = [f"{tag} {n}".encode() for n in range(index, count, len(publishers))]
        publish_all(pub, f"jobs/{index}", payloads, qos)
        pub.disconnect()
        sent.extend(payloads)
    return sent


def join_and_leave(paho_client: Callable[..., PahoClient], broker: BrokerProcess,
                   *workers: str, qos: int = 1) -> None:
    for worker in workers:
        client = paho_client(worker, port=broker.tcp, clean_start=False, session_expiry=EXPIRY)
        assert client.subscribe(SHARE, qos) == [qos]
        client.disconnect()
        wait_offline(broker.ports["http"], worker)


def resume(paho_client: Callable[..., PahoClient], broker: BrokerProcess,
           worker: str, **kwargs: object) -> PahoClient:
    client = paho_client(worker, port=broker.tcp, clean_start=False, session_expiry=EXPIRY,
                         **kwargs)
    assert client.connack is not None and client.connack.session_present is True
    return client


def collect(workers: list[PahoClient], expected: list[bytes]) -> dict[bytes, list[str]]:
    """Waits until the workers together hold every expected payload; returns who got each
    (after a barrier on each, so nothing more is on its way)."""
    wanted = set(expected)

    def done() -> bool:
        return wanted <= {m.payload for w in workers for m in list(w.messages)}

    wait_until(done, timeout=60, what=f"{len(wanted)} jobs across the workers")
    receivers: dict[bytes, list[str]] = {}
    for worker in workers:
        for message in worker.barrier():
            if message.topic.startswith("jobs/"):
                receivers.setdefault(message.payload, []).append(worker.client_id)
    return receivers


def subscriptions_of(broker: BrokerProcess, client_id: str) -> list[str]:
    found = http_json(broker.ports["http"], f"/api/v5/clients/{client_id}/subscriptions")
    items = found["data"] if isinstance(found, dict) else found
    return sorted(item["topic"] for item in items)


@pytest.mark.parametrize("how", ["kill", "graceful"])
def test_acknowledged_jobs_and_the_subscription_survive_a_restart(
    paho_client, start_broker, how: str
) -> None:
    broker = start_broker()
    w1, w2 = unique("w1"), unique("w2")
    join_and_leave(paho_client, broker, w1, w2)
    sent = publish_jobs(paho_client, broker, JOBS)

    broker = restart(broker, start_broker, how)

    assert SHARE in subscriptions_of(broker, w1)
    workers = [resume(paho_client, broker, w1), resume(paho_client, broker, w2)]
    receivers = collect(workers, sent)
    assert sorted(receivers) == sorted(sent)
    doubled = {payload: who for payload, who in receivers.items() if len(who) > 1}
    assert not doubled, f"jobs delivered to two workers: {list(doubled.items())[:5]}"
    # Without a new SUBSCRIBE the group goes on: the next jobs flow too, to both workers.
    more = publish_jobs(paho_client, broker, 64, "more")
    receivers = collect(workers, more)
    assert all(len(receivers[payload]) == 1 for payload in more)
    assert set(Counter(who[0] for who in receivers.values() if who)) == {w1, w2}


def test_jobs_wait_in_storage_until_a_member_connects(paho_client, start_broker) -> None:
    """With no member connected the group's jobs stay stored; the first member back gets
    them all, the other one (whose session was restored) none twice."""
    broker = start_broker()
    w1, w2 = unique("w1"), unique("w2")
    join_and_leave(paho_client, broker, w1, w2)
    sent = publish_jobs(paho_client, broker, 200)
    broker = restart(broker, start_broker, "kill")
    first = resume(paho_client, broker, w1)
    receivers = collect([first], sent)
    assert sorted(receivers) == sorted(sent)
    second = resume(paho_client, broker, w2)
    assert not [m for m in second.barrier() if m.topic.startswith("jobs/")]


def start_slow_and_fast(paho_client: Callable[..., PahoClient], broker: BrokerProcess,
                        ) -> tuple[str, PahoClient, PahoClient, list[bytes], set[bytes]]:
    """Two members, one of which never acknowledges: it holds what fits its in-flight
    window, the other one takes everything of its own shards."""
    w1, w2 = unique("w1"), unique("w2")
    join_and_leave(paho_client, broker, w1, w2)
    slow = resume(paho_client, broker, w1, manual_ack=True)
    fast = resume(paho_client, broker, w2)
    wait_until(lambda: all(m["shards"] for m in http_json(
        broker.ports["http"], "/api/v5/durable_shared_groups")["data"][0]["members"]),
        what="shards for both members")
    sent = publish_jobs(paho_client, broker, 320)
    wait_until(lambda: http_json(broker.ports["http"], f"/api/v5/clients/{w1}")[
        "inflight_cnt"] >= 1, what="jobs in flight to the slow member")
    held = {m.payload for m in slow.barrier() if m.topic.startswith("jobs/")}
    assert held and len(held) < len(sent)
    return w1, slow, fast, sent, held


def test_a_member_that_drops_keeps_its_in_flight_jobs_the_others_take_its_share(
    paho_client, start_broker
) -> None:
    """MQTT-4.8.2-4: what was in flight to a member whose connection broke is finished on
    that member when it comes back; the rest of its shards go to the member still
    connected, at once."""
    broker = start_broker()
    w1, slow, fast, sent, held = start_slow_and_fast(paho_client, broker)
    slow.kill()
    receivers = collect([fast], sorted(set(sent) - held))
    assert not held & set(receivers)
    back = resume(paho_client, broker, w1)
    redelivered = back.wait_messages(len(held), timeout=60)
    assert {m.payload for m in redelivered} == held
    assert all(m.dup for m in redelivered)


def test_jobs_of_a_member_whose_session_ended_go_to_another_member(
    paho_client, start_broker
) -> None:
    """MQTT-4.8.2-5: QoS 1 jobs a member left unacknowledged when its session ended are
    delivered to another member, once, without DUP."""
    broker = start_broker()
    w1, slow, fast, sent, held = start_slow_and_fast(paho_client, broker)
    slow.kill()
    ended = paho_client(w1, port=broker.tcp, clean_start=True)  # ends the session
    assert ended.connack is not None and ended.connack.session_present is False
    assert subscriptions_of(broker, w1) == []
    receivers = collect([fast], sent)
    assert sorted(receivers) == sorted(sent)
    assert all(len(who) == 1 for who in receivers.values())
    redelivered = [m for m in fast.messages if m.payload in held]
    assert sorted(m.payload for m in redelivered) == sorted(held)
    assert not any(m.dup for m in redelivered)
    assert broker.metric("mqtt_shared_group_redelivered_total") >= len(held)


def test_qos2_jobs_a_member_was_never_sent_go_to_another_member_when_its_session_ends(
    paho_client, start_broker
) -> None:
    """MQTT-4.8.2-5 keeps from the other members only the QoS 2 jobs the ended member was
    sent: those read for it beyond its Receive Maximum and never sent go to another member,
    once; those it received never do."""
    broker = start_broker()
    w1, w2 = unique("w1"), unique("w2")
    join_and_leave(paho_client, broker, w1, w2, qos=2)
    window = props(PacketTypes.CONNECT, ReceiveMaximum=4)
    slow = resume(paho_client, broker, w1, manual_ack=True, properties=window)
    fast = resume(paho_client, broker, w2)
    wait_until(lambda: all(m["shards"] for m in http_json(
        broker.ports["http"], "/api/v5/durable_shared_groups")["data"][0]["members"]),
        what="shards for both members")
    sent = publish_jobs(paho_client, broker, 320, qos=2)
    # Its window full (no PUBCOMP goes out), nothing more is sent to it.
    wait_until(lambda: http_json(broker.ports["http"], f"/api/v5/clients/{w1}")[
        "inflight_cnt"] == 4, what="a full window at the slow member")
    held = {m.payload for m in slow.barrier() if m.topic.startswith("jobs/")}
    assert len(held) == 4
    slow.kill()
    ended = paho_client(w1, port=broker.tcp, clean_start=True)  # ends the session
    assert ended.connack is not None and ended.connack.session_present is False
    receivers = collect([fast], sorted(set(sent) - held))
    assert not held & set(receivers)
    assert all(len(who) == 1 for who in receivers.values())
    assert not any(m.dup for m in fast.messages)


def test_the_group_goes_with_its_last_member(paho_client, start_broker) -> None:
    broker = start_broker()
    w1 = unique("w1")
    join_and_leave(paho_client, broker, w1)
    groups = http_json(broker.ports["http"], "/api/v5/durable_shared_groups")["data"]
    assert [(g["group"], g["filter"], [m["clientid"] for m in g["members"]])
            for g in groups] == [("workers", "jobs/#", [w1])]
    publish_jobs(paho_client, broker, 32)
    assert http_json(broker.ports["http"], "/api/v5/durable_shared_groups")["data"][0][
        "backlog"] == 32
    paho_client(w1, port=broker.tcp, clean_start=True).disconnect()
    wait_until(lambda: not http_json(broker.ports["http"],
                                     "/api/v5/durable_shared_groups")["data"],
               what="the group gone")
    # Nobody wants jobs any more: they are not stored.
    assert broker.metric("mqtt_durable_filters") == 0


def test_mosquitto_clients_as_a_durable_group_through_kill_9(start_broker) -> None:
    """The README's commands: MQTT 3.1.1 workers with clean session 0 join with
    mosquitto_sub and leave, mosquitto_pub publishes, the broker is killed; back, the
    workers subscribe to nothing of the group and get every job once between them."""
    broker = start_broker()
    workers = [unique("w1"), unique("w2")]
    for worker in workers:
        joining = MosquittoSub(broker.tcp, [SHARE], qos=1, extra=["-i", worker, "-c", "-E"])
        assert joining.start().wait_exit() == 0
    sent = []
    for index, publisher in enumerate(publisher_ids()[:4]):
        for n in range(10):
            sent.append(f"job {index}-{n}")
            mosquitto_pub(broker.tcp, f"jobs/{index}", sent[-1], qos=1,
                          extra=["-i", publisher])
    broker = restart(broker, start_broker, "kill")
    subs = [MosquittoSub(broker.tcp, ["unrelated/topic"], qos=1, extra=["-i", w, "-c"])
            for w in workers]
    try:
        for sub in subs:
            sub.start()
        wait_until(lambda: sum(len(sub.messages) for sub in subs) >= len(sent), timeout=60,
                   what="every job at the mosquitto_sub workers")
        got = [m.payload for sub in subs for m in sub.messages]
        assert sorted(got) == sorted(sent)
    finally:
        for sub in subs:
            sub.close()


def test_workers_joining_at_once_get_every_job_once(start_broker) -> None:
    """Shards move while the group reads: each worker that joins takes its share from the
    others (asked back, freed, handed out) while the ones before it are still moving; then
    20 publishers go at full speed. Three groups in turn."""
    broker = start_broker()
    clients: list[PahoClient] = []
    try:
        for group in range(3):
            workers = [PahoClient(broker.tcp, unique(f"w{n}")) for n in range(4)]
            clients += workers
            for worker in workers:
                worker.connect(clean_start=False, session_expiry=EXPIRY)
                assert worker.subscribe(f"$share/g{group}/jobs/#", 1) == [1]
            publishers = [PahoClient(broker.tcp, unique("p")) for _ in range(20)]
            clients += publishers
            infos, sent = [], []
            for n, publisher in enumerate(publishers):
                publisher.connect()
                payloads = [f"{group}-{n}-{k}".encode() for k in range(250)]
                infos += [publisher.client.publish(f"jobs/{n}", p, 1) for p in payloads]
                sent += payloads
            for info in infos:
                info.wait_for_publish(60)
                assert info.is_published()
            who = collect(workers, sent)
            assert sorted(who) == sorted(sent)
            assert all(len(receivers) == 1 for receivers in who.values())
            for worker in workers:
                worker.disconnect()
    finally:
        for client in clients:
            client.close()


def test_a_stalled_member_holds_back_only_its_window(paho_client, start_broker) -> None:
    """A member that stops acknowledging with its window full is passed over after
    `durable_sessions.shared_subscription_ack_timeout`: the other member gets every job
    but those on the wire to it; once it acknowledges, it gets its share again."""
    broker = start_broker(**{"durable_sessions.shared_subscription_ack_timeout": "1s"})
    w1, slow, fast, sent, held = start_slow_and_fast(paho_client, broker)
    assert len(held) == 32  # mqtt.max_inflight
    who = collect([fast], sorted(set(sent) - held))
    assert not held & set(who)
    assert slow.connected
    stalled = [m for m in http_json(broker.ports["http"], "/api/v5/durable_shared_groups")[
        "data"][0]["members"] if m["stalled"]]
    assert [m["clientid"] for m in stalled] == [w1]
    for message in list(slow.messages):
        slow.ack(message.mid, message.qos)
    wait_until(lambda: all(m["shards"] for m in http_json(
        broker.ports["http"], "/api/v5/durable_shared_groups")["data"][0]["members"]),
        what="the member back with shards once it acknowledged")
