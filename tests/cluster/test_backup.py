"""Backup and restore of a builtin_raft cluster (issue 39), with real processes: an export
taken from one node while QoS 1 publishers on two others run, checked, then an increment
(`--since` it) from another after a seal; a corrupted copy refused; the archive and its
increment imported into a fresh 3-node cluster (its generations through the shards' Raft
logs, the sealed ones the increment leaves out from the full archive), where the durable
sessions resume on any node with Session Present 1 and every message acknowledged before the
increment began, the retained messages are equal and the shared group goes on."""

import json
import tarfile
from pathlib import Path

from tests.cluster.conftest import Cluster, Node
from tests.cluster.test_replicated_ds import _filters_everywhere, _start
from tests.integration.clients import PahoClient, wait_until
from tests.integration.test_backup import (
    EXPIRY,
    RETAINED,
    SHARE,
    Publisher,
    corrupt,
    ctl,
    publish_after,
    receives_all,
    resume,
    retained_on,
    seal,
)


def url(node: Node) -> str:
    return f"http://127.0.0.1:{node.http}"


def test_export_a_cluster_under_load_and_import_it_into_a_fresh_one(
        tmp_path: Path, clients: list[PahoClient]) -> None:
    source_cluster, target_cluster = Cluster(tmp_path / "a"), Cluster(tmp_path / "b")
    try:
        source = _start(source_cluster)
        for node, client_id, topic in ((source[0], "durable-1", "data/#"),
                                       (source[1], "durable-2", "data/#"),
                                       (source[2], "worker-1", SHARE)):
            sub = PahoClient(node.process.tcp, client_id)
            clients.append(sub)
            sub.connect(clean_start=False, session_expiry=EXPIRY)
            assert sub.subscribe([(topic, 1)]) == [1]
            sub.disconnect()
        _filters_everywhere(source, 2)
        setter = PahoClient(source[2].process.tcp, "setter")
        clients.append(setter)
        setter.connect()
        for topic, payload in RETAINED.items():
            setter.client.publish(topic, payload, 1, retain=True).wait_for_publish(10)
        publishers = []
        for n, node in enumerate(source[:2]):
            client = PahoClient(node.process.tcp, f"publisher-{n}")
            clients.append(client)
            client.connect()
            publishers.append(Publisher(client, f"p{n}"))
        for publisher in publishers:
            publisher.start()
        wait_until(lambda: all(len(p.snapshot()) >= 50 for p in publishers), 30, "50 each")
        seal(source[0].process)
        wait_until(lambda: all(len(p.snapshot()) >= 100 for p in publishers), 30, "100 each")
        before_cut = [m for p in publishers for m in p.snapshot()]
        archive, increment = tmp_path / "cluster.tar", tmp_path / "since.tar"
        ctl("export", str(archive), "--url", url(source[2]))
        checked = ctl("verify", str(archive), "-o", "json")
        assert '"backend": "builtin_raft"' in checked.stdout
        seal(source[1].process)  # the archive's current generations: in the increment
        wait_until(lambda: sum(len(p.snapshot()) for p in publishers) >= len(before_cut) + 50,
                   30, "more after the export")
        before_cut = [m for p in publishers for m in p.snapshot()]
        ctl("export", str(increment), "--since", json.loads(checked.stdout)["created"],
            "--url", url(source[0]))
        with tarfile.open(increment) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert any(not g["in_archive"] for g in manifest["generations"])
        wait_until(lambda: sum(len(p.snapshot()) for p in publishers) >= len(before_cut) + 50,
                   30, "more after the increment")
        for publisher in publishers:
            publisher.stop.set()
            publisher.join(30)
        with tarfile.open(archive) as tar:
            names = tar.getnames()
        assert any(name.endswith(".ldb") for name in names), names
        bad = tmp_path / "bad.tar"
        corrupt(archive, "retained.pairs.000000", bad)
        assert "retained.pairs.000000: checksum mismatch" in ctl("verify", str(bad),
                                                                  ok=False).stderr
        for client in clients:
            client.close()
        clients.clear()
        source_cluster.stop_all()

        target = _start(target_cluster)
        refused = ctl("import", str(bad), "--url", url(target[1]), ok=False)
        assert "400 BAD_ARCHIVE" in refused.stderr
        ctl("import", str(archive), str(increment), "--url", url(target[1]))
        assert "409 NOT_EMPTY" in ctl("import", str(archive), "--url", url(target[0]),
                                      ok=False).stderr
        after = publish_after(target[1].process.tcp, clients)
        for node, client_id in ((target[0], "durable-1"), (target[2], "durable-2")):
            durable = resume(node.process.tcp, client_id)
            clients.append(durable)
            receives_all(durable, before_cut + after)
        for node in target:
            assert retained_on(node.process.tcp) == RETAINED
        worker = resume(target[2].process.tcp, "worker-1")
        clients.append(worker)
        setter = PahoClient(target[0].process.tcp, "setter-2")
        clients.append(setter)
        setter.connect()
        setter.client.publish("jobs/2", b"job after", 1).wait_for_publish(10)
        assert worker.wait_message_on("jobs/2").payload == b"job after"
    finally:
        source_cluster.stop_all()
        target_cluster.stop_all()
