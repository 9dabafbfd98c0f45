"""A new replica of a shard that holds sealed generations gets them as their LevelDB files
(broker/ds/shipped.py), not by replaying the log, at `durable_storage.raft.snapshot_bytes_rate`;
a kill -9 of the receiver in the middle of the transfer leaves a node that starts and
resumes after what it had received whole, and a file damaged on its disk meanwhile is
detected by its checksum and fetched again, never installed. Real processes, real files."""

import re
import shutil
from pathlib import Path

from tests.cluster.conftest import Cluster, Node, http_json
from tests.cluster.test_ds_placement import N_SHARDS, durable_pair
from tests.cluster.test_replicated_ds import REPLICATED, _client, _groups_led
from tests.integration.clients import PahoClient, wait_until

SEALING = {**REPLICATED,
           # Sealed early and often: a few MiB make several sealed generations.
           "durable_storage.messages.generation_max_size": "1MB",
           # Slow enough that the transfer is under way when the test kills the receiver.
           "durable_storage.raft.snapshot_bytes_rate": "1MB/s"}
MESSAGES = 400
PAYLOAD = 16 * 1024


def staged(node: Node) -> list[Path]:
    """The files the node received so far (each `.part` until the install; `.crc` beside
    one received whole)."""
    return sorted(node.process.data_dir.glob("ds/messages/*.snapshot-files/gen-*/*"))


def whole_tables(node: Node) -> list[Path]:
    return [p.with_suffix(".part") for p in staged(node) if p.name.endswith(".ldb.crc")]


def applied_everything(nodes: list[Node]) -> bool:
    commits: dict[int, int] = {}
    applied: list[dict[int, int]] = []
    for node in nodes:
        groups = http_json(node.http, "/api/v5/raft")["groups"]
        for group in groups:
            commits[group["id"]] = max(commits.get(group["id"], 0), group["commit"])
        applied.append({group["id"]: group["applied"] for group in groups})
    return all(seen.get(group, -1) >= index for seen in applied
               for group, index in commits.items())


def votes_everywhere(node: Node) -> bool:
    raft = http_json(node.http, "/api/v5/raft")
    return all(raft["site"] in group["voters"] for group in raft["groups"])


def installs(node: Node) -> list[tuple[int, int, int]]:
    """(shipped, kept, fetched again) of each shard snapshot the node installed."""
    found = []
    for line in node.process.log_lines:
        match = re.search(r"(\d+) files shipped, (\d+) kept from an earlier transfer, (\d+)"
                          r" fetched again", line)
        if match:
            found.append((int(match[1]), int(match[2]), int(match[3])))
    return found


def test_a_new_replica_gets_sealed_generations_as_files_and_resumes_after_kill_9(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = cluster.start(3, **SEALING)
    cluster.all_running(nodes)
    cluster.wait_version(nodes)
    _groups_led(nodes, 2 + N_SHARDS)
    subscriber, publisher, topic = durable_pair(clients, nodes[0], nodes[1], "files")
    subscriber.disconnect()
    sent = [b"%06d" % n + bytes(PAYLOAD) for n in range(MESSAGES)]  # 6.4 MB, one shard
    for payload in sent:
        assert publisher.publish(topic, payload, qos=1) == 0
    wait_until(lambda: applied_everything(nodes), 60, "every node applied every message")
    lost = nodes[2]
    lost.process.kill()
    shutil.rmtree(lost.process.data_dir)
    lost.process.start()  # a new site: added to every group as a learner

    # Mid-transfer (1 MB/s): some files received whole, then kill -9.
    wait_until(lambda: len(whole_tables(lost)) >= 2, 60,
               "tables of sealed generations received whole on the new replica")
    lost.process.kill()  # SIGKILL
    tables = whole_tables(lost)
    assert installs(lost) == []  # nothing was installed
    # One of them damaged on its disk, as a power loss could leave a file never synced:
    # its bytes no longer match its checksum.
    damaged = tables[-1]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))

    lost.process.start()  # same data dir: the same site, the transfer resumes
    wait_until(lambda: bool(installs(lost)), 120, "the shard's snapshot installed")
    ((shipped, kept, fetched_again),) = installs(lost)
    assert shipped > len(tables) and kept >= len(tables)  # (the damaged part counts too)
    assert fetched_again == 1
    assert staged(lost) == []
    wait_until(lambda: applied_everything(nodes), 60, "the new replica caught up")
    # Promoted once it holds the shard, not before: then the groups have a majority
    # without the node killed next.
    wait_until(lambda: votes_everywhere(lost), 30, "the new replica a voter of every group")

    # Its replica serves the session: the node that held it dies, it resumes on the new one.
    nodes[0].process.kill()
    resumed = _client(clients, lost, subscriber.client_id)
    assert resumed.connect(clean_start=False, session_expiry=3600, timeout=30).session_present
    wait_until(lambda: len({m.payload for m in resumed.messages}) >= MESSAGES, 60,
               "every stored message from the new replica")
    assert {m.payload for m in resumed.messages} == set(sent)
