"""Ownership of durable sessions across a partition (builtin_raft, real processes behind
front doors): a node cut off while its session moved and ended cannot bring it back."""

import pytest

from tests.cluster.conftest import Node, http_json
from tests.cluster.jepsen.harness import RAFT, Harness, backend
from tests.integration.clients import PahoClient, unique, wait_until

pytestmark = pytest.mark.integration


def _sees_stopped(node: Node, peer: Node) -> bool:
    return any(entry["node"] == peer.node_name and entry["node_status"] == "stopped"
               for entry in http_json(node.http, "/api/v5/cluster")["nodes"])


def test_a_node_cut_off_cannot_bring_back_a_session_that_ended_meanwhile(
        jepsen, clients: list[PahoClient]) -> None:
    """n1 serves the session; cut off, it still sees its client leave and writes the
    session's meta (disconnected). Meanwhile the client came back on n2 with Clean Start and
    no expiry, which claimed the session from n1 and ended it. Once the partition heals,
    n1's write reaches the log after the end: the replicas must refuse it, or the ended
    session comes back, owned by n1, for the next client of that ID."""
    harness: Harness = jepsen(doors=True, **backend(RAFT))
    n1, n2, n3 = harness.nodes
    client_id, topic = unique("fenced"), unique("fence").replace("-", "/")

    first = PahoClient(n1.process.tcp, client_id)
    clients.append(first)
    first.connect(clean_start=False, session_expiry=3600)
    first.subscribe(f"{topic}/#", qos=1)
    harness.nemesis.wait_healthy()  # the session and its subscription replicated

    harness.nemesis.partition(["n1"], ["n2", "n3"])
    wait_until(lambda: _sees_stopped(n2, n1), 20, "n2 sees n1 cut off")
    second = PahoClient(n2.process.tcp, client_id)
    clients.append(second)
    assert not second.connect(clean_start=True, session_expiry=0).session_present
    second.disconnect()
    assert n2.metric("mqtt_cluster_takeovers_total", outcome="resumed") == 1  # claimed

    first.disconnect()  # n1 writes the meta of a session that ended on the other side
    wait_until(lambda: not http_json(n1.http, f"/api/v5/clients/{client_id}")["connected"],
               10, "n1 saw its client leave")
    assert all(node.metric("mqtt_durable_session_writes_refused_total") == 0
               for node in harness.nodes)

    harness.nemesis.heal()
    wait_until(lambda: all(node.metric("mqtt_durable_session_writes_refused_total") >= 1
                           for node in harness.nodes),
               40, "every replica refused n1's writes of the ended session")
    third = PahoClient(n3.process.tcp, client_id)
    clients.append(third)
    assert not third.connect(clean_start=False, session_expiry=0).session_present
