"""The dashboard of one node of a real three-node cluster (replicated Durable Storage), in a
real browser: it kicks a client connected to another node, and shows every node, every
durable session (also one whose node was killed, from the replicated sessions database,
its missed count still growing) and where each shard's replicas are.

Waits are on what the page shows (Playwright's `expect` retries) or on a client's callback.
"""

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.cluster.conftest import Cluster, Node
from tests.cluster.test_ds_placement import durable_pair
from tests.cluster.test_replicated_ds import REPLICATED, _groups_led
from tests.dashboard.conftest import Dashboard, call, login, paho
from tests.integration.clients import PahoClient

pytestmark = pytest.mark.integration

ADMINISTRATIVE_ACTION = 0x98
N_GROUPS = 2 + 4  # metadata, sessions and REPLICATED's four messages shards


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    """Three running nodes whose Raft groups all have leaders; killed at teardown."""
    cluster = Cluster(tmp_path / "cluster")
    try:
        started = cluster.start(3, **REPLICATED)
        cluster.all_running(started)
        _groups_led(started, N_GROUPS)
        yield started
    finally:
        cluster.stop_all()


def _logged_in(dashboard: Callable[..., Dashboard], node: Node, view: str) -> Dashboard:
    tab = dashboard(node.process)
    tab.log_in()
    expect(tab.page.locator("#app")).to_be_visible()
    tab.view(view)
    return tab


def test_kick_a_client_connected_to_another_node(
        nodes: list[Node], dashboard: Callable[..., Dashboard],
        clients: list[PahoClient]) -> None:
    n1, n2, _ = nodes
    tab = _logged_in(dashboard, n1, "clients")
    victim = paho(clients, n2.process, session_expiry=3600)
    row = tab.client_row(victim.client_id)
    expect(row.locator("td").nth(1)).to_have_text(n2.node_name)
    row.get_by_role("button", name="Kick").click()
    row.get_by_role("button", name="Confirm kick").click()
    assert victim.wait_disconnected() == ADMINISTRATIVE_ACTION
    expect(tab.page.locator("#notice")).to_have_text(f"Kicked {victim.client_id}.")
    expect(row).to_have_count(0)  # its durable session went too, on n2
    status, body = call(n1.http, f"/api/v5/clients/{victim.client_id}", "DELETE",
                        token=login(n1.http))
    assert status == 404 and "already gone" in body["message"]
    assert tab.errors == []


def test_every_node_every_durable_session_and_each_shards_replicas(
        nodes: list[Node], dashboard: Callable[..., Dashboard],
        clients: list[PahoClient]) -> None:
    n1, n2, n3 = nodes
    tab = _logged_in(dashboard, n1, "overview")
    page = tab.page
    expect(page.locator("[data-card=Nodes]")).to_have_text("3 of 3 up")
    for node in nodes:
        row = page.locator(f"#nodes tr[data-node='{node.node_name}']")
        expect(row.locator("td").nth(2)).to_have_text("up")
        expect(row.locator("td.joined")).to_have_text("joined")

    # A durable session served by n3, away: listed on n1 with what n3 counts it missed.
    subscriber, publisher, topic = durable_pair(clients, n3, n2, "away")
    subscriber.disconnect()
    tab.view("clients")
    row = tab.client_row(subscriber.client_id)
    expect(row.locator("td").nth(1)).to_have_text(n3.node_name)
    expect(row.locator("td").nth(2)).to_have_text("offline")
    for _ in range(2):
        assert publisher.publish(topic, b"m", qos=1) == 0
    expect(row.locator("td.missed")).to_have_text("2")
    token = login(n1.http)
    listed = call(n1.http, "/api/v5/durable_sessions?cluster=true", token=token)[1]["data"]
    assert [(s["node"], s["served"], s["missed_cnt"]) for s in listed
            if s["clientid"] == subscriber.client_id] == [(n3.node_name, True, 2)]
    # Without cluster=true a node answers for its own (what kubectl mqtt sessions merges).
    assert call(n1.http, "/api/v5/durable_sessions", token=token)[1]["data"] == []

    tab.view("storage")
    expect(page.locator("#sites tbody tr")).to_have_count(3)
    expect(page.locator("#shards tbody tr")).to_have_count(5)  # sessions + 4 messages shards
    for shard in ("sessions", "messages shard 0", "messages shard 3"):
        voters = page.locator(f"#shards tr[data-shard='{shard}'] td.voters")
        for node in nodes:
            expect(voters).to_contain_text(node.node_name)
    expect(page.locator("#chosen")).to_contain_text(n3.node_name)

    # n3 killed: shown down; its session is still listed, from n1's replica, and counted.
    n3.process.kill()
    tab.view("overview")
    expect(page.locator("[data-card=Nodes]")).to_have_text("2 of 3 up")
    expect(page.locator(f"#nodes tr[data-node='{n3.node_name}'] td").nth(2)).to_have_text(
        "down")
    tab.view("clients")
    expect(row.locator("td").nth(2)).to_have_text("offline, node down")
    expect(row.locator("td.expires")).to_have_text(re.compile(r"^59m \d+s$|^1h"))
    assert publisher.publish(topic, b"m", qos=1) == 0  # two of three replicas: a majority
    expect(row.locator("td.missed")).to_have_text("3")
    # Kicked: n1 takes the session over from the down node and ends it.
    row.get_by_role("button", name="Kick").click()
    row.get_by_role("button", name="Confirm kick").click()
    expect(page.locator("#notice")).to_have_text(f"Kicked {subscriber.client_id}.")
    expect(row).to_have_count(0)
    back = paho(clients, n2.process, client_id=subscriber.client_id, clean_start=False,
                session_expiry=0)
    assert not back.connack.session_present
    assert tab.errors == []
