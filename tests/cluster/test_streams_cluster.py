"""Named streams on a `builtin_raft` cluster of real broker processes: created through one
node, stored by the node a publisher uses, replayed on a third, and resumed on another
node after the reader's node is killed."""

from paho.mqtt.packettypes import PacketTypes

from tests.cluster.conftest import Cluster, http_json
from tests.cluster.test_replicated_ds import _client, _filters_everywhere, _start
from tests.integration.clients import PahoClient, http_send, props, unique, wait_until

EXPIRY = 3600


def test_a_stream_made_on_one_node_is_replayed_on_another_and_resumed_on_a_third(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = _start(cluster)
    topic = unique("fleet").replace("-", "/")
    made = http_json(nodes[0].http, "/api/v5/message_streams", "POST",
                     {"name": "fleet", "topic_filter": f"{topic}/#"})
    wait_until(lambda: all(http_json(node.http, "/api/v5/message_streams")["data"] == [made]
                           for node in nodes), 10, "the stream on every node")
    _filters_everywhere(nodes, 1)

    publisher = _client(clients, nodes[1], unique("pub"))
    publisher.connect()
    sent = {f"{topic}/{t}": [f"{t}-{i}".encode() for i in range(40)] for t in range(5)}
    for i in range(40):
        for name, payloads in sent.items():
            assert publisher.publish(name, payloads[i], qos=1) == 0

    client_id = unique("replayer")
    reader = PahoClient(nodes[2].process.tcp, client_id, manual_ack=True)
    clients.append(reader)
    reader.connect(clean_start=False, session_expiry=EXPIRY,
                   properties=props(PacketTypes.CONNECT, ReceiveMaximum=20))
    # QoS 2 granted: each batch record is committed on a majority before its messages go
    # out, so what the reader holds is replicated when its node dies (a QoS 1 record may
    # still be on its way then: its batch is read and delivered again, without DUP).
    assert reader.subscribe("$stream/fleet", 2,
                            user_properties=[("stream-offset", "earliest")]) == [2]
    held = reader.wait_messages(20)
    assert len(reader.barrier()) == 20  # the window: nothing acknowledged yet
    nodes[2].process.kill()  # kill -9 of the reader's node, mid-replay

    resumed = _client(clients, nodes[0], client_id)
    assert resumed.connect(clean_start=False, session_expiry=EXPIRY).session_present
    received = resumed.wait_messages(200, timeout=30)
    by_topic: dict[str, list[bytes]] = {}
    for message in received:
        by_topic.setdefault(message.topic, []).append(message.payload)
    assert by_topic == sent  # all of them, once, each topic in its publisher's order
    # What was on the wire comes again with DUP (so does what was recorded and read
    # ahead: it may have been sent).
    assert {m.payload for m in held} <= {m.payload for m in received if m.dup}

    assert publisher.publish(f"{topic}/0", b"live", qos=1) == 0
    assert resumed.wait_messages(201)[-1].payload == b"live"
    assert len(resumed.barrier()) == 201

    assert http_send(nodes[1].http, "DELETE", "/api/v5/message_streams/fleet")[0] == 204
    wait_until(lambda: all(http_json(node.http, "/api/v5/message_streams")["data"] == []
                           for node in nodes[:2]), 10, "the stream gone everywhere")
