"""One follower of a 3-node `builtin_raft` cluster runs out of space (its data directory, Raft
log included, on a 40 MiB tmpfs of its own, mounted here as root, filled up): the cluster
goes on acknowledging QoS 1 PUBLISHes through the two others, the full node raises its
disk_full alarm and acknowledges none of its own clients' durable PUBLISHes, and once space
is freed it catches up by itself: its replica of the publisher's shard applies everything
committed, and a durable session moved to it reads every acknowledged message from that
replica. The same with the full node killed (SIGKILL) while full and started again on its
full volume. (The full node joins after the others elected their leaders, so it leads no
group: a full leader hands its groups over, tests/raft/test_full_log.py.)"""

from pathlib import Path

import pytest

from broker.ds.db import shard_of
from tests.cluster.conftest import Cluster, Node, http_json
from tests.cluster.test_replicated_ds import REPLICATED, _filters_everywhere, _groups_led
from tests.integration.clients import PahoClient, unique, wait_until
from tests.support.full_disk import (
    fill,
    number_of,
    publish_one,
    publish_until_refused,
    tmpfs,
)

DISK_FULL = "mqtt_alarm_active"
QUOTA_EXCEEDED = 0x97
ROUND = 100  # PUBLISHes between two looks at the full node's alarm


def _shard_group(node: Node, shard: int) -> dict[str, object]:
    groups = http_json(node.http, "/api/v5/raft")["groups"]
    return next(g for g in groups if g["name"] == f"messages shard {shard}")


def _follows_everything(node: Node) -> None:
    """`node` votes in the sessions group and in every shard's, and leads none of them:
    started after the others had elected their leaders (a full leader would hand its
    groups over first: tests/raft/test_full_log.py)."""
    def ready() -> bool:
        groups = http_json(node.http, "/api/v5/raft")["groups"]
        ds = [g for g in groups if g["name"] != "metadata"]
        return len(ds) == 5 and all(g["leader"] and len(g["voters"]) == 3 for g in ds)
    wait_until(ready, 60, f"{node.name} a voter of every Durable Storage group")
    for group in http_json(node.http, "/api/v5/raft")["groups"]:
        assert group["role"] == "follower", group


def _alarm(node: Node) -> float:
    return node.metric(DISK_FULL, alarm="disk_full")


@pytest.mark.parametrize("killed", [False, True], ids=["running", "killed_while_full"])
def test_a_follower_without_space_lets_the_others_acknowledge_and_catches_up(
        cluster: Cluster, clients: list[PahoClient], tmp_path: Path, killed: bool) -> None:
    with tmpfs(tmp_path / "volume", 40) as volume:
        try:
            nodes = cluster.make(3, **{**REPLICATED, "durable_storage.n_sites": "2"})
            full = nodes[2]
            full.process.data_dir = volume / "data"
            for node in nodes[:2]:
                node.start()
            cluster.all_running(nodes[:2])
            _groups_led(nodes[:2], 1 + 1 + 4)
            full.start()
            cluster.all_running(nodes)
            _follows_everything(full)
            topic, reader_id = unique("full").replace("-", "/"), unique("reader")
            reader = PahoClient(nodes[0].process.tcp, reader_id)
            clients.append(reader)
            reader.connect(clean_start=False, session_expiry=3600)
            reader.subscribe(f"{topic}/#", qos=1)
            reader.disconnect()
            _filters_everywhere(nodes, 1)
            publisher, port = unique("pub"), nodes[0].process.tcp
            shard = shard_of(publisher, 4)

            filler = fill(volume, 8)
            acked: set[int] = set()
            while not _alarm(full):
                sent = publish_until_refused(port, publisher, f"{topic}/x", len(acked),
                                             limit=ROUND)
                assert len(sent.acked) == ROUND and not sent.closed, sent
                acked |= sent.acked
                assert len(acked) < 50_000, "the follower's volume never filled"
            # Full: the two others go on acknowledging; the full node refuses its own.
            more = publish_until_refused(port, publisher, f"{topic}/x", 1_000_000, limit=300)
            assert len(more.acked) == 300 and not more.closed, more
            acked |= more.acked
            # Its own clients' durable PUBLISHes: refused (0x97), or not even connected
            # while a CONNECT waits for its replicas to apply; never acknowledged.
            refused = publish_one(full.process.tcp, unique("pub"), f"{topic}/x", 2_000_000)
            assert refused.closed and not refused.acked, refused
            assert refused.disconnect_reason in (None, QUOTA_EXCEEDED), refused
            committed = _shard_group(nodes[0], shard)["commit"]
            assert _shard_group(full, shard)["applied"] < committed  # type: ignore[operator]
            if killed:  # kill -9, and a start on the volume still full (its reserve)
                full.process.kill()
                full.start()

            filler.unlink()
            wait_until(lambda: not _alarm(full), 60, "the full node's alarm cleared")
            wait_until(lambda: _shard_group(full, shard)["applied"] >= committed,  # type: ignore[operator]
                       60, "the full node's replica of the shard caught up")
            # The session moves to the node that was full, and reads its own replica.
            moved = PahoClient(full.process.tcp, reader_id)
            clients.append(moved)
            assert moved.connect(clean_start=False, session_expiry=3600).session_present
            got: set[int] = set()

            def all_there() -> bool:
                got.update(number_of(m.payload) for m in moved.messages)
                return acked <= got
            wait_until(all_there, 60, "every acknowledged message, read on the node that was full")
        finally:
            cluster.stop_all()  # before the volume is unmounted
