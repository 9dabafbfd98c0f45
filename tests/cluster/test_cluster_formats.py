"""A 3-node `builtin_raft` cluster of release 0.1.0 (built from git, `RELEASES`), stopped and
started again with this tree on the same data dirs: every node's formats open (members,
the metadata group's voters, the write-ahead log of every group, the replicated sessions and
messages, the retained store), each is stamped, and the durable session, the messages stored
for it and the retained message are all there (docs/formats.md)."""

import json
from pathlib import Path

from broker.cluster import versions
from broker.formats import DATA_DIR, STAMP, WAL_DIR, stamp_of
from tests.cluster.conftest import Cluster
from tests.cluster.test_replicated_ds import REPLICATED, _filters_everywhere, _groups_led
from tests.integration.clients import NO_MATCHING_SUBSCRIBERS, PahoClient, unique, wait_until
from tests.support import releases


def test_a_cluster_of_release_0_1_0_restarts_on_this_release_with_everything(
        cluster: Cluster, clients: list[PahoClient], tmp_path: Path) -> None:
    code = releases.build("0.1.0", tmp_path)
    nodes = cluster.make(3, **REPLICATED)
    for node in nodes:
        node.process.code = code
        node.start()
    cluster.all_running(nodes)
    _groups_led(nodes, 1 + 1 + 4)  # metadata, sessions, 4 shards
    client_id, topic = unique("kept"), unique("formats").replace("-", "/")
    subscriber = PahoClient(nodes[0].process.tcp, client_id)
    clients.append(subscriber)
    subscriber.connect(clean_start=False, session_expiry=3600)
    subscriber.subscribe(f"{topic}/#", qos=1)
    subscriber.disconnect()
    _filters_everywhere(nodes, 1)
    publisher = PahoClient(nodes[1].process.tcp, unique("pub"))
    clients.append(publisher)
    publisher.connect()
    sent = [f"m{i}".encode() for i in range(20)]
    for i, payload in enumerate(sent):
        assert publisher.publish(f"{topic}/{i % 4}", payload, qos=1) == 0
    assert publisher.publish(f"{topic}-retained", b"kept", qos=1,
                             retain=True) == NO_MATCHING_SUBSCRIBERS
    publisher.close()
    for node in nodes:
        assert node.process.stop() == 0
        assert not (node.process.data_dir / STAMP).exists()

    for node in nodes:
        node.process.code = None
        node.process.log_lines.clear()
        node.start()
    cluster.all_running(nodes)
    _groups_led(nodes, 1 + 1 + 4)
    cluster.wait_version(nodes, versions.HIGHEST)
    for node in nodes:
        data_dir = node.process.data_dir
        # Stamped, and the version the cluster rose to recorded (0.1.0 refused from now on).
        wait_until(lambda d=data_dir: json.loads((d / STAMP).read_text()) == {
            **stamp_of(DATA_DIR), "cluster": {"version": versions.HIGHEST,
                                              "run_by": versions.RUN_BY[-1]}}, 10,
            f"{node.name}'s stamp recording the cluster version")
        assert json.loads((data_dir / "raft" / "wal" / STAMP).read_text()) == stamp_of(WAL_DIR)
    resumed = PahoClient(nodes[2].process.tcp, client_id)
    clients.append(resumed)
    assert resumed.connect(clean_start=False, session_expiry=3600).session_present
    assert sorted(m.payload for m in resumed.wait_messages(len(sent), timeout=30)) == sorted(sent)
    reader = PahoClient(nodes[0].process.tcp, unique("reader"))
    clients.append(reader)
    reader.connect()
    reader.subscribe(f"{topic}-retained", qos=1)
    assert [m.payload for m in reader.wait_messages(1)] == [b"kept"]
