"""Output is written at the end of the read that produced it, once per destination."""

import asyncio
from pathlib import Path

from broker.config.loader import load_config
from broker.mqtt.codec import Decoder, encode
from broker.mqtt.packets import Connect, Puback, Publish, Subscribe, Subscription
from broker.node import Node
from broker.server.connection import Connection
from broker.server.output import OutputBatch
from tests.support.transport import RecordingTransport

V4 = 4


def _client(
    node: Node, output: OutputBatch, client_id: str
) -> tuple[Connection, RecordingTransport]:
    transport = RecordingTransport()
    connection = Connection(node, transport, output)
    connection.data_received(encode(Connect(client_id=client_id, protocol_level=V4), V4))
    return connection, transport


async def test_deliveries_and_acks_leave_in_one_write_per_destination_within_the_read(
    tmp_path: Path,
) -> None:
    node = Node(load_config(None, [f"node.data_dir={tmp_path}"]))
    output = OutputBatch(asyncio.get_running_loop())
    sub, sub_t = _client(node, output, "sub")
    sub.data_received(encode(Subscribe(1, [Subscription("t", qos=1)]), V4))
    pub, pub_t = _client(node, output, "pub")
    sub_t.writes.clear()
    pub_t.writes.clear()

    burst = b"".join(encode(Publish("t", b"%d" % i, qos=1, packet_id=i + 1), V4)
                     for i in range(10))
    pub.data_received(burst)  # no await: nothing may wait for a later event-loop turn

    assert len(sub_t.writes) == 1 and len(pub_t.writes) == 1
    delivered = Decoder(version=V4).feed(sub_t.writes[0])
    assert [p.payload for p in delivered] == [b"%d" % i for i in range(10)]
    assert Decoder(version=V4).feed(pub_t.writes[0]) == [Puback(i + 1) for i in range(10)]
    node.close()


async def test_a_full_window_reopens_within_the_read_of_the_acks(tmp_path: Path) -> None:
    node = Node(load_config(None, [f"node.data_dir={tmp_path}", "mqtt.max_inflight=2"]))
    output = OutputBatch(asyncio.get_running_loop())
    sub, sub_t = _client(node, output, "sub")
    sub.data_received(encode(Subscribe(1, [Subscription("t", qos=1)]), V4))
    pub, _ = _client(node, output, "pub")
    sub_t.writes.clear()
    pub.data_received(b"".join(encode(Publish("t", b"x", qos=1, packet_id=i + 1), V4)
                               for i in range(4)))
    first = Decoder(version=V4).feed(b"".join(sub_t.writes))
    assert [p.packet_id for p in first] == [1, 2]  # the window holds two
    sub_t.writes.clear()

    sub.data_received(encode(Puback(1), V4) + encode(Puback(2), V4))

    assert len(sub_t.writes) == 1
    assert [p.packet_id for p in Decoder(version=V4).feed(sub_t.writes[0])] == [3, 4]
    node.close()


async def test_acknowledgements_waiting_on_storage_leave_in_publish_order(
    tmp_path: Path,
) -> None:
    """MQTT-4.6.0-2: a PUBACK whose message is durable sooner still waits for the earlier
    ones, and one needing no storage waits behind them too; each group leaves as soon as
    everything before it may."""
    node = Node(load_config(None, [f"node.data_dir={tmp_path}"]))
    loop = asyncio.get_running_loop()
    output = OutputBatch(loop)
    pub, pub_t = _client(node, output, "pub")
    pub_t.writes.clear()
    first, second = loop.create_future(), loop.create_future()
    pub.send_when(first, encode(Puback(1), V4))
    pub.send_when(first, encode(Puback(2), V4))  # the same read: the same group
    pub.send_when(None, encode(Puback(3), V4))  # needs nothing, but comes after 1 and 2
    pub.send_when(second, encode(Puback(4), V4))
    pub.send_when(None, encode(Puback(5), V4))
    pub.send_when(None, encode(Puback(6), V4))

    second.set_result(None)
    await asyncio.sleep(0)  # its callback runs: nothing may leave before 1 and 2
    pub.flush()
    assert pub_t.writes == []
    first.set_result(None)
    await asyncio.sleep(0)
    pub.flush()
    acks = Decoder(version=V4).feed(b"".join(pub_t.writes))
    assert [ack.packet_id for ack in acks] == [1, 2, 3, 4, 5, 6]
    node.close()
