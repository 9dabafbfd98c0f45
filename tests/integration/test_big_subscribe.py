"""One SUBSCRIBE with thousands of filters from a durable session (issue 15, defect 2).

Each new filter used to look up the streams of every filter the session already had, so
one packet of 5,000 filters held the event loop for minutes and every other client with it.
Here another client keeps pinging while the SUBSCRIBE (or an UNSUBSCRIBE of as many filters)
is applied: the longest wait it sees is the test. The session keeps its filters across a
restart.
"""

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest

from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import PropertyId
from broker.mqtt.packets import (
    Connack,
    Connect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
)
from tests.integration.clients import BOTH, api_client, scrape_metrics, unique, wait_until
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

FILTERS = 5000
# The longest another client may wait for a PINGRESP meanwhile: generous for a shared
# 2-core machine (a round trip takes milliseconds), far below what one SUBSCRIBE held the
# loop for before (seconds at 2,000 filters, minutes at 5,000).
MAX_GAP = 0.5
TIMEOUT = 30.0
# Topics of the first filters are written before the big SUBSCRIBE: past ten values of their
# second level Durable Storage keeps them in one `+` stream, which every filter then reads.
WARM = 12


class Client:
    """A raw MQTT client on asyncio streams: sends exactly the packets the test builds and
    returns exactly what the broker answers, in order."""

    def __init__(self, port: int, version: int) -> None:
        self.port = port
        self.version = version
        self.decoder = Decoder(version=version)
        self.pending: list[Packet] = []
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self, client_id: str, clean: bool = True) -> Connack:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        properties = {PropertyId.SESSION_EXPIRY_INTERVAL: 3600} if self.version == 5 and \
            not clean else {}
        self.send(Connect(client_id, self.version, clean, 60, properties=properties))
        connack = await self.recv()
        assert isinstance(connack, Connack) and connack.reason_code == 0, connack
        return connack

    def send(self, *packets: Packet) -> None:
        """All in one write, so the broker reads them together."""
        assert self.writer is not None
        self.writer.write(b"".join(encode(packet, self.version) for packet in packets))

    async def recv(self, timeout: float = TIMEOUT) -> Packet:
        assert self.reader is not None
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionError("closed by broker")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    async def messages(self, count: int) -> set[tuple[str, bytes]]:
        """The next `count` PUBLISHes (acknowledged), other packets skipped."""
        found: set[tuple[str, bytes]] = set()
        while len(found) < count:
            packet = await self.recv()
            if isinstance(packet, Publish):
                found.add((packet.topic, packet.payload))
                if packet.qos:
                    self.send(Puback(packet.packet_id))
        return found

    async def publish(self, topic: str, payload: bytes) -> None:
        self.send(Publish(topic, payload, 1, packet_id=1))
        assert isinstance(await self.recv(), Puback)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()


async def first_answer(pinger: Client, client: Client) -> Packet:
    """The client's next packet, while `pinger` pings back to back: fails as soon as one
    PINGREQ waits MAX_GAP for its PINGRESP, instead of when the client's answer comes."""
    stop = asyncio.Event()
    pinging = asyncio.create_task(ping_until(pinger, stop))
    answer = asyncio.create_task(client.recv())
    await asyncio.wait({answer, pinging}, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    gap = await pinging
    if gap >= MAX_GAP:
        answer.cancel()
    assert gap < MAX_GAP, f"another client waited {gap:.2f}s for PINGRESP"
    return await answer


async def ping_until(client: Client, stop: asyncio.Event) -> float:
    """Pings back to back until `stop`; the longest time between two PINGRESPs (returned
    at once, as MAX_GAP or more, when one takes longer than that)."""
    longest = 0.0
    last = time.monotonic()
    while not stop.is_set():
        client.send(Pingreq())
        try:
            assert isinstance(await client.recv(MAX_GAP), Pingresp)
        except TimeoutError:
            return time.monotonic() - last
        now = time.monotonic()
        longest, last = max(longest, now - last), now
    return longest


async def subscribe_many(broker: BrokerProcess, version: int, client_id: str,
                         prefix: str) -> None:
    """The durable session subscribes to FILTERS filters in one packet while another
    client pings; then the session is left (its state on disk)."""
    pinger, sub, pub = (Client(broker.tcp, version) for _ in range(3))
    try:
        await pinger.connect(unique("pinger"))
        await pub.connect(unique("pub"))
        await sub.connect(client_id, clean=False)
        warm = [Subscription(f"{prefix}/{i}", 1) for i in range(WARM)]
        sub.send(Subscribe(1, warm))
        assert isinstance(await sub.recv(), Suback)
        for i in range(WARM):
            await pub.publish(f"{prefix}/{i}", b"warm")
        assert len(await sub.messages(WARM)) == WARM

        last = f"{prefix}/{FILTERS - 1}"
        # The big SUBSCRIBE, then in the same write a PUBLISH to its last filter and a
        # PINGREQ: they must be handled after the SUBSCRIBE, as they came.
        sub.send(Subscribe(2, [Subscription(f"{prefix}/{i}", 1) for i in range(FILTERS)]),
                 Publish(last, b"own", 1, packet_id=3), Pingreq())
        suback = await first_answer(pinger, sub)
        assert isinstance(suback, Suback) and suback.packet_id == 2, suback
        assert suback.reason_codes == [1] * FILTERS

        found: set[tuple[str, bytes]] = set()
        acked = pinged = False
        while not (acked and pinged and found):
            packet = await sub.recv()
            acked = acked or (isinstance(packet, Puback) and packet.packet_id == 3)
            pinged = pinged or isinstance(packet, Pingresp)
            if isinstance(packet, Publish):
                found.add((packet.topic, packet.payload))
                sub.send(Puback(packet.packet_id))
        assert found == {(last, b"own")}
        for i in (WARM, FILTERS // 2):
            await pub.publish(f"{prefix}/{i}", b"spot")
        assert await sub.messages(2) == {(f"{prefix}/{WARM}", b"spot"),
                                         (f"{prefix}/{FILTERS // 2}", b"spot")}
    finally:
        for client in (pinger, sub, pub):
            await client.close()


@BOTH
async def test_subscribing_and_unsubscribing_thousands_of_filters_stalls_no_one(
    start_broker: Callable[..., BrokerProcess], version: int
) -> None:
    broker = start_broker()
    client_id, prefix = unique("durable"), unique("t")
    await subscribe_many(broker, version, client_id, prefix)

    # Back (within the same run) and unsubscribed from every filter in one packet.
    pinger, sub = Client(broker.tcp, version), Client(broker.tcp, version)
    try:
        await pinger.connect(unique("pinger"))
        assert (await sub.connect(client_id, clean=False)).session_present
        filters = [f"{prefix}/{i}" for i in range(FILTERS)]
        sub.send(Unsubscribe(4, filters))
        unsuback = await first_answer(pinger, sub)
        assert isinstance(unsuback, Unsuback) and unsuback.packet_id == 4, unsuback
        if version == 5:
            assert unsuback.reason_codes == [0] * FILTERS
        assert api_client(broker.ports["http"], client_id)["subscriptions_cnt"] == 0
    finally:
        await pinger.close()
        await sub.close()


async def test_a_session_keeps_thousands_of_filters_across_a_restart(
    start_broker: Callable[..., BrokerProcess]
) -> None:
    broker = start_broker()
    client_id, prefix = unique("durable"), unique("t")
    await subscribe_many(broker, 5, client_id, prefix)
    http = broker.ports["http"]
    wait_until(lambda: not api_client(http, client_id)["connected"], what="session away")
    wait_until(lambda: scrape_metrics(http)["mqtt_durable_state_writes_pending"] == 0,
               what="session state on disk")
    broker.kill()
    broker = start_broker(broker.data_dir)
    assert api_client(broker.ports["http"], client_id)["subscriptions_cnt"] == FILTERS

    sub, pub = Client(broker.tcp, 5), Client(broker.tcp, 5)
    try:
        assert (await sub.connect(client_id, clean=False)).session_present
        await pub.connect(unique("pub"))
        for i in (3, 3333, FILTERS - 2):
            await pub.publish(f"{prefix}/{i}", b"after")
        assert await sub.messages(3) == {(f"{prefix}/{i}", b"after")
                                         for i in (3, 3333, FILTERS - 2)}
    finally:
        await sub.close()
        await pub.close()
