"""A node whose data volume fills up (a 40 MiB tmpfs of its own, mounted here as root): a
publisher's QoS 1 PUBLISHes to a durable subscriber's topic are stored until the volume is
full, then refused (no PUBACK; MQTT 5 DISCONNECT 0x97 Quota exceeded), the disk_full alarm
is raised (metric, `$SYS`, API), traffic between non-durable sessions goes on, and once
space is freed (the filler file deleted) the alarm clears by itself, durable publishes are
acknowledged again and the durable subscriber gets every message that was acknowledged.
The second test kills the node (SIGKILL) while the volume is full and starts it again on it
(the reserve the node keeps on its volume, ds/reserve.bin, makes room for its databases to
open; broker/ds/space.py).
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.clients import PahoClient, http_json, scrape_metrics, unique, wait_until
from tests.support.broker_process import BrokerProcess
from tests.support.full_disk import (
    Outcome,
    fill,
    number_of,
    publish_one,
    publish_until_refused,
    tmpfs,
)

QUOTA_EXCEEDED = 0x97
DISK_FULL = 'mqtt_alarm_active{alarm="disk_full"}'
SIZE_MIB = 40
LEAVE_MIB = 12  # left free by the filler: what the publisher fills
NODE = "full@127.0.0.1"


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "volume", SIZE_MIB) as mounted:
        yield mounted


class Clients:
    """The test's clients, all closed at the end, failed or not."""

    def __init__(self) -> None:
        self.all: list[PahoClient] = []

    def make(self, port: int, client_id: str, **kwargs: object) -> PahoClient:
        client = PahoClient(port, client_id, **kwargs)  # type: ignore[arg-type]
        self.all.append(client)
        return client

    def close(self) -> None:
        for client in self.all:
            client.close()


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    yield made
    made.close()


def _subscribe_durably(clients: Clients, port: int, client_id: str, topic: str) -> None:
    subscriber = clients.make(port, client_id, version=4, clean_session=False)
    subscriber.connect()
    subscriber.subscribe(topic, 1)
    subscriber.disconnect()


def _alarm_watcher(clients: Clients, port: int) -> PahoClient:
    watcher = clients.make(port, unique("alarms"))
    watcher.connect()
    watcher.subscribe("$SYS/brokers/+/alarms/#", 0)
    return watcher


def _assert_plain_traffic_goes_on(clients: Clients, port: int) -> None:
    """Two clients without durable sessions: QoS 0 and QoS 1 between them are delivered
    (and the QoS 1 PUBLISH acknowledged) while durable writes are refused."""
    topic = unique("plain")
    receiver = clients.make(port, unique("plain-sub"))
    receiver.connect()
    receiver.subscribe(topic, 1)
    sender = clients.make(port, unique("plain-pub"))
    sender.connect()
    assert sender.publish(topic, b"qos0", 0) == 0
    assert sender.publish(topic, b"qos1", 1) == 0
    assert sorted(m.payload for m in receiver.wait_messages(2)) == [b"qos0", b"qos1"]


def _assert_refused(outcome: Outcome) -> None:
    assert outcome.closed and outcome.disconnect_reason == QUOTA_EXCEEDED, outcome
    assert not outcome.refused_codes, outcome


def _assert_alarm(broker: BrokerProcess, watcher: PahoClient, change: str) -> None:
    message = watcher.wait_message_on(f"$SYS/brokers/{NODE}/alarms/{change}")
    alarm = json.loads(message.payload)
    assert alarm["name"] == "disk_full" and alarm["activated"] == (change == "activate")
    port = broker.ports["http"]
    active = http_json(port, "/api/v5/alarms?activated=true")["data"]
    assert ("disk_full" in [a["name"] for a in active]) == (change == "activate")
    cleared = http_json(port, "/api/v5/alarms?activated=false")["data"]
    assert ("disk_full" in [a["name"] for a in cleared]) == (change == "deactivate")
    http_json(port, "/api/v5/alarms?activated=maybe", status=400)
    assert scrape_metrics(port)[DISK_FULL] == (change == "activate")


def _fill_until_refused(broker: BrokerProcess, volume: Path, topic: str) -> tuple[Path, set[int]]:
    filler = fill(volume, LEAVE_MIB)
    outcome = publish_until_refused(broker.tcp, unique("pub"), topic, 0)
    _assert_refused(outcome)
    assert len(outcome.acked) > 100, outcome  # it stored until the volume was full
    return filler, outcome.acked


def _recover_and_check(broker: BrokerProcess, clients: Clients, watcher: PahoClient,
                       filler: Path, topic: str, subscriber: str, acked: set[int]) -> None:
    filler.unlink()
    _assert_alarm(broker, watcher, "deactivate")
    after = publish_until_refused(broker.tcp, unique("pub"), topic, 1_000_000, limit=50)
    assert len(after.acked) == 50 and not after.closed, after
    acked |= after.acked
    reader = clients.make(broker.tcp, subscriber, version=4, clean_session=False)
    assert reader.connect().session_present
    got: set[int] = set()

    def all_there() -> bool:
        got.update(number_of(m.payload) for m in reader.messages)
        return acked <= got
    wait_until(all_there, timeout=60, what="every acknowledged message")


@dataclass
class Filled:
    """A broker whose volume a publisher filled: durable PUBLISHes are refused now."""

    broker: BrokerProcess
    watcher: PahoClient  # subscribed to the $SYS alarm topics before the volume filled
    topic: str
    subscriber: str  # a durable session subscribed to the topic, away
    filler: Path
    acked: set[int]


@pytest.fixture
def filled(volume: Path, clients: Clients) -> Iterator[Filled]:
    broker = BrokerProcess(volume / "data", {"node.name": NODE}).start()
    try:
        topic, subscriber = unique("disk"), unique("durable")
        _subscribe_durably(clients, broker.tcp, subscriber, topic + "/#")
        watcher = _alarm_watcher(clients, broker.tcp)
        assert scrape_metrics(broker.ports["http"])[DISK_FULL] == 0
        filler, acked = _fill_until_refused(broker, volume, topic + "/x")
        yield Filled(broker, watcher, topic, subscriber, filler, acked)
    finally:
        broker.kill()


def test_a_full_volume_refuses_durable_publishes_until_space_is_back(
        filled: Filled, clients: Clients) -> None:
    broker = filled.broker
    _assert_alarm(broker, filled.watcher, "activate")
    _assert_plain_traffic_goes_on(clients, broker.tcp)
    # While full, a durable PUBLISH is refused at once, and nothing acknowledges it.
    _assert_refused(publish_one(broker.tcp, unique("pub"), filled.topic + "/x", 999_999))
    _recover_and_check(broker, clients, filled.watcher, filled.filler, filled.topic,
                       filled.subscriber, filled.acked)


def test_killed_while_full_the_node_starts_again_and_loses_nothing(
        filled: Filled, clients: Clients) -> None:
    broker = filled.broker
    broker.kill()
    broker.start()  # on the volume still full: the reserve it kept lets it open
    watcher = _alarm_watcher(clients, broker.tcp)
    _assert_plain_traffic_goes_on(clients, broker.tcp)
    # What the reserve freed is used, then durable PUBLISHes are refused again.
    more = publish_until_refused(broker.tcp, unique("pub"), filled.topic + "/x", 500_000)
    _assert_refused(more)
    _assert_alarm(broker, watcher, "activate")
    _recover_and_check(broker, clients, watcher, filled.filler, filled.topic,
                       filled.subscriber, filled.acked | more.acked)
