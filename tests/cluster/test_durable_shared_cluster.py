"""Durable shared subscriptions on three `builtin_raft` nodes: a consumer group whose
workers sit on different nodes gets every acknowledged job once, through kill -9 of a
worker's node and of every node, and a worker that resumes on another node keeps its share.
"""

from concurrent.futures import ThreadPoolExecutor

from tests.cluster.conftest import Cluster, Node, http_json
from tests.cluster.test_replicated_ds import REPLICATED, _client, _start
from tests.integration.clients import PahoClient, unique, wait_until
from tests.integration.test_durable_shared import collect, publisher_ids

SHARE = "$share/workers/jobs/#"
EXPIRY = 3600
N_SHARDS = 4


def _join(clients: list[PahoClient], node: Node, worker: str,
          manual_ack: bool = False) -> PahoClient:
    client = PahoClient(node.process.tcp, worker, manual_ack=manual_ack)
    clients.append(client)
    client.connect(clean_start=False, session_expiry=EXPIRY)
    assert client.subscribe(SHARE, 1) == [1]
    return client


def _publish(clients: list[PahoClient], nodes: list[Node], count: int,
             tag: str) -> list[bytes]:
    """`count` QoS 1 jobs from a publisher per shard, the publishers spread over the nodes,
    every job acknowledged."""
    sent = []
    for index, publisher_id in enumerate(publisher_ids(N_SHARDS)):
        publisher = _client(clients, nodes[index % len(nodes)], f"{publisher_id}")
        publisher.connect()
        for n in range(index, count, N_SHARDS):
            payload = f"{tag} {n}".encode()
            assert publisher.publish(f"jobs/{index}", payload, qos=1, timeout=30) == 0
            sent.append(payload)
        publisher.disconnect()
    return sent


def _group(node: Node) -> dict[str, object]:
    groups = http_json(node.http, "/api/v5/durable_shared_groups")["data"]
    assert [g["topic"] for g in groups] == [SHARE]
    return groups[0]  # type: ignore[no-any-return]


def _every_shard_read(node: Node, members: int) -> None:
    def spread() -> bool:
        group = _group(node)
        owned = [m["shards"] for m in group["members"] if m["connected"]]  # type: ignore
        return len(owned) == members and all(owned) and sum(map(len, owned)) == N_SHARDS

    try:
        wait_until(spread, 30, f"the shards spread over {members} connected members")
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}: {_group(node)}") from None


def _once_each(who: dict[bytes, list[str]]) -> None:
    doubled = {payload: workers for payload, workers in who.items() if len(workers) > 1}
    assert not doubled, f"jobs delivered to two workers: {list(doubled.items())[:5]}"


def test_workers_on_three_nodes_share_the_jobs_once_each(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = _start(cluster)
    workers = [_join(clients, node, unique(f"w{i}")) for i, node in enumerate(nodes)]
    for node in nodes:  # any node answers for the cluster
        _every_shard_read(node, 3)
    sent = _publish(clients, nodes, 120, "job")
    who = collect(workers, sent)
    assert sorted(who) == sorted(sent)
    _once_each(who)
    assert {receivers[0] for receivers in who.values()} == {w.client_id for w in workers}


def test_a_worker_whose_node_dies_resumes_elsewhere_with_its_share(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """kill -9 of a worker's node, with jobs in flight to it: it resumes on another node with
    Session Present 1 and its subscription, gets what it had in flight again (DUP), and
    takes its share of the next jobs; no job reaches two workers."""
    nodes = _start(cluster)
    doomed, other, third = nodes
    w1 = unique("w1")
    slow = _join(clients, doomed, w1, manual_ack=True)  # never acknowledges
    fast = _join(clients, other, unique("w2"))
    _every_shard_read(other, 2)
    sent = _publish(clients, [other, third], 200, "job")
    wait_until(lambda: http_json(doomed.http, f"/api/v5/clients/{w1}")["inflight_cnt"] >= 1,
               30, "jobs in flight to the worker on the doomed node")
    held = {m.payload for m in slow.barrier() if m.topic.startswith("jobs/")}
    assert held
    doomed.process.kill()
    # Its shards go on to the other member at once: it takes every job published now.
    _every_shard_read(other, 1)
    during = _publish(clients, [other, third], 40, "during")
    assert set(during) <= set(collect([fast], during))
    back = _client(clients, third, w1)
    assert back.connect(clean_start=False, session_expiry=EXPIRY).session_present
    subscriptions = http_json(third.http, f"/api/v5/clients/{w1}/subscriptions")
    assert SHARE in [s["topic"] for s in subscriptions]
    # What the dead node had recorded for its member (on the wire, or read ahead) comes to
    # it; everything else went to the other member.
    who = collect([fast, back], sent + during)
    assert sorted(who) == sorted(sent + during)
    _once_each(who)
    again = [m for m in back.messages if m.payload in held]
    assert len(again) == len(held) and all(m.dup for m in again)
    _every_shard_read(third, 2)
    more = _publish(clients, [other, third], 40, "more")
    who = collect([fast, back], more)
    _once_each(who)
    assert {receivers[0] for receivers in who.values()} == {fast.client_id, w1}


def test_every_node_killed_loses_no_acknowledged_job(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    nodes = _start(cluster)
    names = [unique("w1"), unique("w2")]
    for worker, node in zip(names, nodes, strict=False):
        _join(clients, node, worker).disconnect()
    sent = _publish(clients, nodes, 200, "job")
    for node in nodes:
        node.process.kill()
    for node in nodes:
        node.start()
    cluster.all_running(nodes, 60)
    workers = []
    for worker, node in zip(names, reversed(nodes), strict=False):
        client = _client(clients, node, worker)
        assert client.connect(clean_start=False, session_expiry=EXPIRY, timeout=60
                              ).session_present
        workers.append(client)
    who = collect(workers, sent)
    assert sorted(who) == sorted(sent)
    _once_each(who)


def test_a_takeover_on_another_node_keeps_the_members_share(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """The member's client connects again on another node while its first connection is
    still up: the session moves with its subscription, and the member keeps receiving its
    share of the jobs there."""
    nodes = _start(cluster)
    w1 = unique("w1")
    first = _join(clients, nodes[0], w1)
    other = _join(clients, nodes[1], unique("w2"))
    _every_shard_read(nodes[2], 2)
    moved = _client(clients, nodes[2], w1)
    assert moved.connect(clean_start=False, session_expiry=EXPIRY).session_present
    first.wait_disconnected()
    _every_shard_read(nodes[0], 2)
    sent = _publish(clients, nodes, 80, "job")
    who = collect([moved, other], sent)
    assert sorted(who) == sorted(sent)
    _once_each(who)
    assert {receivers[0] for receivers in who.values()} == {w1, other.client_id}
    assert not [m for m in first.messages if m.topic.startswith("jobs/")]



def test_members_subscribing_in_a_fresh_clusters_first_moments_join_their_group(
        cluster: Cluster, clients: list[PahoClient]) -> None:
    """A fresh cluster runs cluster version 0 until its metadata leader's next round raises
    it. A durable session's `$share` SUBSCRIBE in that moment waits for the rise instead of
    being routed live: not stored with the session, and moved into the group at the rise,
    while messages in flight between nodes come twice or, sent to a member whose route just
    went, not at all (bench/shared_bench.py saw both). A worker on each node subscribes as
    soon as its node takes a durable session; each SUBACK comes once the session is a
    member, and no node moves a routed subscription into its group."""
    nodes = cluster.start(3, **REPLICATED)
    workers = [PahoClient(node.process.tcp, unique(f"early{i}")) for i, node in enumerate(nodes)]
    clients.extend(workers)

    def subscribe_early(worker: PahoClient) -> list[int]:
        wait_until(lambda: worker.connect(clean_start=False, session_expiry=EXPIRY,
                                          expect_success=False).reason_code == 0
                   or worker.disconnect(), 30, "a durable session on the fresh cluster")
        return worker.subscribe(SHARE, 1)

    with ThreadPoolExecutor(len(workers)) as pool:
        assert list(pool.map(subscribe_early, workers)) == [[1]] * len(workers)
    expected = {worker.client_id for worker in workers}

    def members(node: Node) -> set[str]:
        groups = http_json(node.http, "/api/v5/durable_shared_groups")["data"]
        return {m["clientid"] for g in groups if g["topic"] == SHARE for m in g["members"]}

    assert members(nodes[0]) >= {workers[0].client_id}  # a member by its SUBACK
    for node in nodes:
        wait_until(lambda n=node: members(n) == expected, 15,
                   f"the group on {node.name} listing every worker")
    for node in nodes:
        assert "routed live until the cluster allowed" not in node.process.log_text()
