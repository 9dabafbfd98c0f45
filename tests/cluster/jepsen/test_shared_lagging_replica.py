"""A durable group's batch handed back to a member whose node's replica of the messages
shard lags behind: that node is cut from the shard's leader (a bridge: the third node sees
both), so it still follows the `sessions` log, and takes the shard and what was handed back
in it while its replica of the shard lacks the messages the batch names. It must read them
once its replica holds them, not take the batch as empty (the chaos run's lost message:
published during a bridge cut, read and handed back on one side, taken on the other)."""

import time

import pytest
from paho.mqtt.packettypes import PacketTypes

from broker.ds.db import shard_of
from tests.cluster.conftest import Cluster, Node, http_json
from tests.cluster.jepsen.harness import RAFT, backend
from tests.integration.clients import PahoClient, props, unique, wait_until

pytestmark = pytest.mark.integration

SHARE = "$share/workers/jobs/#"
N_SHARDS = 4
EXPIRY = 3600


def _leader_of(node: Node, name: str) -> str:
    def found() -> str | None:
        for group in http_json(node.http, "/api/v5/raft")["groups"]:
            if group["name"] == name:
                return group["leader"]  # type: ignore[no-any-return]
        return None

    return wait_until(found, 30, f"a leader of {name}")  # type: ignore[no-any-return]


def _shards_of(node: Node, client_id: str) -> list[int]:
    groups = http_json(node.http, "/api/v5/durable_shared_groups")["data"]
    return next((member["shards"] for group in groups for member in group["members"]
                 if member["clientid"] == client_id and member["connected"]), [])


def _client(clients: list[PahoClient], node: Node, client_id: str,
            manual_ack: bool = False) -> PahoClient:
    client = PahoClient(node.process.tcp, client_id, manual_ack=manual_ack)
    clients.append(client)
    return client


@pytest.mark.timeout(180)
def test_a_batch_handed_back_to_a_member_whose_replica_lags_loses_nothing(
        jepsen, clients: list[PahoClient]) -> None:
    harness = jepsen(doors=True, **backend(RAFT))
    nodes = harness.nodes
    Cluster.wait_version(nodes)  # durable groups are joined from cluster version 1
    sites = {http_json(node.http, "/api/v5/raft")["site"]: node for node in nodes}
    # `behind` follows the sessions log (it leads it) and is cut from the leader of the
    # shard the jobs go to (`ahead`); the member that reads them first sits on the third.
    behind = sites[_leader_of(nodes[0], "sessions")]
    leaders = {shard: sites[_leader_of(nodes[0], f"messages shard {shard}")]
               for shard in range(N_SHARDS)}
    shard = next(shard for shard, leader in leaders.items() if leader is not behind)
    ahead = leaders[shard]
    third = next(node for node in nodes if node not in (behind, ahead))
    publisher_id = next(f"pub-{n}" for n in range(1000) if shard_of(f"pub-{n}", N_SHARDS) == shard)

    publisher = _client(clients, ahead, publisher_id)
    publisher.connect()
    taker = _client(clients, behind, unique("taker"))
    taker.connect(clean_start=False, session_expiry=EXPIRY)
    first = _client(clients, third, unique("first"), manual_ack=True)  # acknowledges nothing
    window = props(PacketTypes.CONNECT, ReceiveMaximum=1)
    first.connect(clean_start=False, session_expiry=EXPIRY, properties=window)
    assert first.subscribe(SHARE, 1) == [1]
    wait_until(lambda: _shards_of(behind, first.client_id) == list(range(N_SHARDS)), 30,
               "every shard read by the first member")

    harness.nemesis.cut(ahead.name, behind.name)
    sent = [f"job {n}".encode() for n in range(20)]
    for payload in sent:
        assert publisher.publish("jobs/x", payload, qos=1, timeout=30) == 0
    # One job on the wire to the first member, the others read for it and waiting unsent.
    wait_until(lambda: http_json(third.http, f"/api/v5/clients/{first.client_id}")
               ["mqueue_len"] == len(sent) - 1, 30, "the jobs read for the first member")
    held = {m.payload for m in first.barrier() if m.topic == "jobs/x"}
    assert len(held) == 1
    assert taker.subscribe(SHARE, 1) == [1]
    first.disconnect()  # what waits unsent goes back to the group, for the taker
    wait_until(lambda: _shards_of(behind, taker.client_id) == list(range(N_SHARDS)), 30,
               "every shard read by the taker")
    time.sleep(3.0)  # the cut lasts on a while, as a fault does, while it holds the shard
    harness.nemesis.heal()

    wanted = set(sent) - held
    wait_until(lambda: wanted <= {m.payload for m in list(taker.messages)}, 60,
               f"the {len(wanted)} jobs handed back, at the member that took them")
    assert not {m.payload for m in taker.barrier()} & held
