"""The dashboard's Shared groups page in a real browser (headless Debian chromium) against a
real broker: a durable shared group (`$share/workers/jobs/#` of two durable MQTT 5 sessions)
as GET /api/v5/durable_shared_groups describes it, while its members read and while they
are away and its backlog grows.

Nothing is mocked: the page shows what the broker answers. Every wait is on something the
page shows (Playwright's `expect` retries until it holds) or on a client's callback.
"""

from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import Locator, expect

from tests.dashboard.conftest import UI_TIMEOUT_MS, Dashboard, call, login, paho
from tests.integration.clients import PahoClient, unique, wait_until
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

XSS = "<img src=x onerror=alert(1)>"
GROUP, FILTER = "workers", "jobs/#"
SHARED = f"$share/{GROUP}/{FILTER}"
GRANTED_QOS_1 = [1]
PAGE_SECONDS = UI_TIMEOUT_MS / 1000  # what the page shows, polled as long as `expect` waits

LoggedIn = tuple[BrokerProcess, Dashboard]


def group_block(tab: Dashboard) -> Locator:
    return tab.page.locator(f'#groups-detail .group[data-group="{GROUP}"]'
                            f'[data-filter="{FILTER}"]')


def member_row(tab: Dashboard, client_id: str) -> Locator:
    return group_block(tab).locator(".group-members tbody tr").filter(
        has=tab.page.get_by_role("cell", name=client_id, exact=True))


def stream_backlogs(tab: Dashboard) -> list[int]:
    texts = group_block(tab).locator(".group-streams tbody td.backlog").all_inner_texts()
    return [int(text) for text in texts]


def stream_owners(tab: Dashboard) -> set[str]:
    return set(group_block(tab).locator(".group-streams tbody td.owner").all_inner_texts())


def this_node(broker: BrokerProcess) -> dict[str, Any]:
    status, nodes = call(broker.ports["http"], "/api/v5/nodes", token=login(broker.ports["http"]))
    assert status == 200 and len(nodes) == 1, nodes
    return dict(nodes[0])


def wait_offline(broker: BrokerProcess, token: str, client_id: str) -> None:
    """Until the broker has detached the session from its connection: a message published
    before that could still go to the closing connection instead of the group's backlog."""
    def offline() -> bool:
        status, view = call(broker.ports["http"], f"/api/v5/clients/{quote(client_id, safe='')}",
                            token=token)
        assert status == 200, (status, view)  # durable: the session stays
        return view["connected"] is False

    wait_until(offline, what=f"session {client_id} offline")


def test_shared_group_members_and_backlog_as_they_read_and_leave(
        logged_in: LoggedIn, clients: list[PahoClient]) -> None:
    broker, tab = logged_in
    node = this_node(broker)
    members = [unique("w1"), XSS + unique("w2")]  # a client ID that must stay text
    workers = [paho(clients, broker, client_id, session_expiry=3600) for client_id in members]
    for worker in workers:
        assert worker.subscribe(SHARED, 1) == GRANTED_QOS_1
    publisher = paho(clients, broker)
    for n in range(6):
        assert publisher.publish(f"jobs/{n}", f"job {n}".encode(), qos=1) == 0
    # A shared group: each stored message reaches one of its members, once.
    wait_until(lambda: sum(len(w.messages) for w in workers) >= 6, what="6 jobs delivered")
    received = sorted(m.payload for w in workers for m in w.barrier())
    assert received == sorted(f"job {n}".encode() for n in range(6))

    tab.view("groups")
    row = tab.page.locator(f'#groups tbody tr[data-group="{GROUP}"][data-filter="{FILTER}"]')
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(0)).to_have_text(GROUP)
    expect(row.locator("td").nth(1)).to_have_text(FILTER)
    expect(row.locator("td.members")).to_have_text("2 of 2 connected")
    expect(row.locator("td.backlog")).to_have_text("0")  # all read
    expect(row).to_contain_text(node["node"])
    expect(group_block(tab).locator("h2")).to_have_text(f"Group {GROUP} on {FILTER}")
    for client_id in members:
        member = member_row(tab, client_id)
        expect(member).to_have_count(1)
        expect(member.locator("td").nth(1)).to_have_text(node["node"])
        expect(member.locator("td").nth(2)).to_have_text(node["site"])
        expect(member.locator("td").nth(3)).to_have_text("connected")
    # Every stream that holds jobs is read by one of the two, connected.
    wait_until(lambda: stream_owners(tab) and stream_owners(tab) <= set(members),
               PAGE_SECONDS, "every stream read by a connected member")
    assert set(stream_backlogs(tab)) == {0}

    # Both leave; their durable sessions stay, and so does the group, which no one reads now.
    token = login(broker.ports["http"])
    for worker in workers:
        worker.disconnect()
        wait_offline(broker, token, worker.client_id)
    for n in range(6, 10):
        assert publisher.publish(f"jobs/{n}", f"job {n}".encode(), qos=1) == 0
    expect(row.locator("td.members")).to_have_text("0 of 2 connected")
    expect(row.locator("td.backlog")).to_have_text("4")
    for client_id in members:
        expect(member_row(tab, client_id).locator("td").nth(3)).to_have_text("disconnected")
    # Per stream: the same 4 messages, in streams no connected member reads (no owner, or
    # the last one, kept while no member is connected, shown as disconnected).
    wait_until(lambda: sum(stream_backlogs(tab)) == 4, PAGE_SECONDS, "stream backlogs of 4")
    away = {"none", *(f"{client_id} (disconnected)" for client_id in members)}
    wait_until(lambda: stream_owners(tab) <= away, PAGE_SECONDS, "no stream read now")

    # Client data rendered as text only: no element made of it, no script run.
    assert tab.page.locator("main img").count() == 0
    assert tab.dialogs == [] and tab.errors == []
