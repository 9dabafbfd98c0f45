"""Release 0.1.0 and this tree in one `builtin_raft` cluster (real processes, the old code
built from git: tests/support/releases.py).

With one node on 0.1.0 the cluster works (durable sessions across the two releases, Session
Present 1) and runs cluster version 0: durable shared subscriptions, whose writes 0.1.0's
replicas would admit unfenced, are routed live as 0.1.0 did. Once that node runs this tree
(same data dir) the cluster rises to version 1 and a durable shared group is made. Then
0.1.0 on that node again is refused by its peers at the handshake ("too old": 0.1.0 cannot
check versions, the refusal is the new nodes'), and the other two go on; this tree back on
that data dir rejoins with everything. A backup imported while the cluster runs version 0
is refused with the reason (0.1.0 would skip its LOAD commands) before anything is
proposed; at version 1 the gate lets it through to the next check (the cluster holds data).
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.cluster import versions
from broker.version import RELEASE
from tests.cluster.conftest import Cluster, Node, http_json
from tests.cluster.test_replicated_ds import REPLICATED, _client, _groups_led
from tests.integration.clients import PahoClient, unique, wait_until
from tests.integration.test_backup import ctl
from tests.support.releases import build

OLD = "0.1.0"
EXPIRY = 3600


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield build(OLD, tmp_path_factory.mktemp("releases"))


def _members(node: Node) -> dict[str, dict[str, object]]:
    """node name -> its row of `GET /api/v5/cluster` on `node` (this tree's API)."""
    rows = http_json(node.http, "/api/v5/cluster")["nodes"]
    return {row["node"]: row for row in rows}


def _releases(node: Node) -> dict[str, object]:
    return {name: row["release"] for name, row in _members(node).items()}


def _durable_round_trip(clients: list[PahoClient], subscribed_on: Node, published_on: Node,
                        resumed_on: Node, count: int = 20) -> None:
    """A durable session subscribed on one node, away while `count` QoS 1 messages are
    published on another, resumes on a third with Session Present 1 and gets them all."""
    client_id, topic = unique("mixed"), unique("mix").replace("-", "/")
    subscriber = _client(clients, subscribed_on, client_id)
    subscriber.connect(clean_start=False, session_expiry=EXPIRY)
    assert subscriber.subscribe(f"{topic}/#", qos=1) == [1]
    subscriber.disconnect()
    filters = subscribed_on.metric("mqtt_durable_filters")
    wait_until(lambda: published_on.metric("mqtt_durable_filters") >= filters, 15,
               f"{published_on.name} storing for the session of {subscribed_on.name}")
    publisher = _client(clients, published_on, unique("pub"))
    publisher.connect()
    sent = [f"{topic} {i}".encode() for i in range(count)]
    for i, payload in enumerate(sent):
        assert publisher.publish(f"{topic}/{i % 4}", payload, qos=1, timeout=30) == 0
    publisher.disconnect()
    resumed = _client(clients, resumed_on, client_id)
    assert resumed.connect(clean_start=False, session_expiry=EXPIRY).session_present
    assert sorted(m.payload for m in resumed.wait_messages(count, timeout=30)) == sorted(sent)
    resumed.disconnect()


def _groups(node: Node) -> list[str]:
    return [group["topic"] for group in
            http_json(node.http, "/api/v5/durable_shared_groups")["data"]]


def _raft(node: Node) -> dict[str, Any]:
    return http_json(node.http, "/api/v5/raft")  # type: ignore[no-any-return]


def _led(node: Node) -> list[int]:
    return [g["id"] for g in _raft(node)["groups"] if g["role"] == "leader"]


def _hand_over_skips_the_old_node(cluster: Cluster, nodes: list[Node], new: list[Node],
                                  old: Node) -> None:
    """Stops whichever new node leads a group: elections decide which nodes lead, and in
    some runs the first new node led none."""
    wait_until(lambda: any(_led(node) for node in new), 15, "a new node leading a group")
    stopping = next(node for node in new if _led(node))
    heir = next(node for node in new if node is not stopping)
    led = _led(stopping)
    heir_site = _raft(heir)["site"]
    assert stopping.process.stop() == 0
    assert f"handed the leadership of {len(led)} Raft groups" in stopping.process.log_text()
    leaders = {g["id"]: g["leader"] for g in _raft(heir)["groups"]}
    assert all(leaders[group] == heir_site for group in led), leaders
    assert old.metric("raft_messages_dropped", reason="malformed") == 0
    stopping.start()
    cluster.all_running(nodes)
    _groups_led(nodes, 1 + 1 + 4)


def _import(node: Node, archive: Path) -> str:
    """`ctl data import` of `archive` into the cluster through `node`, refused: its error."""
    refused = ctl("import", str(archive), "--url", f"http://127.0.0.1:{node.http}", ok=False)
    assert refused.returncode == 1, refused.stdout
    return refused.stderr


def test_a_0_1_0_node_runs_with_this_tree_until_upgraded_and_is_refused_after(
        cluster: Cluster, clients: list[PahoClient], old_release: Path,
        tmp_path: Path) -> None:
    nodes = cluster.make(3, **REPLICATED)
    new, upgraded = nodes[:2], nodes[2]
    upgraded.process.code = old_release
    for node in nodes:
        node.start()
    cluster.all_running(nodes)
    _groups_led(nodes, 1 + 1 + 4)  # metadata, sessions, 4 shards
    assert "cluster_version" not in http_json(upgraded.http, "/api/v5/cluster")  # 0.1.0
    wait_until(lambda: all(_releases(node) == {n.node_name: RELEASE for n in new}
                           | {upgraded.node_name: OLD} for node in new),
               15, "the new nodes knowing every member's release")
    assert _members(new[0])[upgraded.node_name]["cluster_versions"] == [0, 0]

    # Mixed: durable sessions move between the releases; a shared subscription is routed.
    _durable_round_trip(clients, new[0], upgraded, new[1])
    _durable_round_trip(clients, new[1], new[0], upgraded)
    share, topic = unique("g"), unique("shared").replace("-", "/")
    member = _client(clients, new[0], unique("member"))
    member.connect(clean_start=False, session_expiry=EXPIRY)
    assert member.subscribe(f"$share/{share}/{topic}/#", qos=1) == [1]
    publisher = _client(clients, upgraded, unique("pub"))
    publisher.connect()
    wait_until(lambda: publisher.publish(f"{topic}/live", b"routed", qos=1) == 0
               and any(m.payload == b"routed" for m in member.messages), 15,
               "the routed shared subscription getting a message from the 0.1.0 node")
    assert _groups(new[0]) == [] and _groups(new[1]) == []  # no durable group: version 0
    for node in new:
        assert node.cluster_version() == 0 and node.metric("mqtt_cluster_version") == 0
    # An import would write LOAD commands, which 0.1.0 skips: refused before the cluster's
    # emptiness is even looked at (it holds data: that refusal would come next).
    archive = tmp_path / "backup.tar"
    wait_until(lambda: ctl("export", str(archive), "--url", f"http://127.0.0.1:{new[0].http}",
                           ok=False).returncode == 0, 60, "an export (its barrier committed)")
    refused = _import(new[1], archive)
    assert "409 CLUSTER_VERSION" in refused and "upgrade every member" in refused

    # A graceful stop of a new node hands its groups only to the other new node: 0.1.0's
    # Raft does not decode TimeoutNow (it would drop it as malformed).
    _hand_over_skips_the_old_node(cluster, nodes, new, upgraded)

    # Upgraded on its data dir: every member runs this tree, the cluster rises.
    upgraded.process.stop()
    upgraded.process.code = None
    upgraded.start()
    cluster.all_running(nodes)
    cluster.wait_version(nodes, versions.HIGHEST)
    for node in nodes:
        assert node.metric("mqtt_cluster_version") == versions.HIGHEST
        assert _releases(node) == {n.node_name: RELEASE for n in nodes}
    # Past the version's gate (its barrier may time out once, the upgraded node just back).
    wait_until(lambda: "409 NOT_EMPTY" in _import(new[1], archive), 60, "NOT_EMPTY")
    # The command it allows: a durable shared group, its writes in every replica.
    share = f"$share/{unique('g')}/{topic}/#"
    worker = _client(clients, new[1], unique("worker"))
    worker.connect(clean_start=False, session_expiry=EXPIRY)
    assert worker.subscribe(share, qos=1) == [1]
    wait_until(lambda: all(share in _groups(node) for node in nodes), 15,
               "the durable group in every node's replica")
    worker.disconnect()
    publisher = _client(clients, new[0], unique("pub"))
    publisher.connect()
    assert publisher.publish(f"{topic}/stored", b"for the group", qos=1) == 0
    publisher.disconnect()
    back = _client(clients, upgraded, worker.client_id)
    assert back.connect(clean_start=False, session_expiry=EXPIRY).session_present
    assert [m.payload for m in back.wait_messages(1, timeout=30)] == [b"for the group"]
    back.disconnect()

    # Downgraded again: refused by both peers at the handshake, which the log says why.
    upgraded.process.stop()
    upgraded.process.code = old_release
    upgraded.start()
    wait_until(lambda: all(node.metric("mqtt_cluster_peers_refused_total",
                                       reason=versions.TOO_OLD) >= 1 for node in new),
               20, "the 0.1.0 node refused by both peers")
    for node in new:
        assert (f"refused: too old: release {OLD} runs cluster versions up to 0, the cluster"
                f" runs {versions.HIGHEST}: run {RELEASE} or newer ({upgraded.node_name}"
                in node.process.log_text())
    cluster.wait_statuses(new, {upgraded.node_name: "stopped"})
    for node in new:
        assert node.cluster_version() == versions.HIGHEST  # never falls
    _durable_round_trip(clients, new[0], new[1], new[1])

    # This tree again on the data dir 0.1.0 ran on while refused: it rejoins, its replicas
    # catch up (the durable group, the session above), and sessions resume through it.
    upgraded.process.stop()
    upgraded.process.code = None
    upgraded.start()
    cluster.all_running(nodes)
    _groups_led(nodes, 1 + 1 + 4)
    assert upgraded.cluster_version() == versions.HIGHEST
    wait_until(lambda: share in _groups(upgraded), 15, "the durable group on the rejoined node")
    _durable_round_trip(clients, upgraded, new[0], upgraded)
