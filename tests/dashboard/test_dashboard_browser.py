"""The dashboard in a real browser (headless Debian chromium) against a real broker: what a
person sees as clients come and go, durable sessions miss messages, and they act on it.

Every wait is on something the page shows (Playwright's `expect` retries until it holds or
times out) or on a client's callback; the page refreshes itself, nothing is reloaded.
"""

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from tests.dashboard.conftest import VIEWER_KEY, Dashboard, call, paho
from tests.integration.clients import PahoClient, publish_props, unique
from tests.support.broker_process import BrokerProcess
from tests.support.full_disk import publish_until_refused

pytestmark = pytest.mark.integration

ADMINISTRATIVE_ACTION = 0x98
XSS = "<img src=x onerror=alert(1)>"

OpenDashboard = Callable[[BrokerProcess], Dashboard]
LoggedIn = tuple[BrokerProcess, Dashboard]


def test_wrong_credentials_are_refused_without_saying_which_half(
        dashboard_broker: Callable[..., BrokerProcess], dashboard: OpenDashboard) -> None:
    tab = dashboard(dashboard_broker())
    tab.log_in("admin", "wrong")
    expect(tab.page.locator("#login-error")).to_have_text("Wrong user name or password.")
    tab.log_in("nobody", "public")
    expect(tab.page.locator("#login-error")).to_have_text("Wrong user name or password.")
    expect(tab.page.locator("#app")).to_be_hidden()


def test_log_in_watch_a_client_connect_live_and_log_out(
        logged_in: LoggedIn, clients: list[PahoClient]) -> None:
    broker, tab = logged_in
    expect(tab.page.locator("[data-card=Connections]")).to_have_text("0")
    tab.view("clients")
    client = paho(clients, broker)
    row = tab.client_row(client.client_id)
    expect(row).to_contain_text("connected")
    expect(row).to_contain_text("MQTT 5.0")
    tab.view("overview")
    expect(tab.page.locator("[data-card=Connections]")).to_have_text("1")
    tab.page.click("#logout")
    expect(tab.page.locator("#login")).to_be_visible()
    tab.open("clients")  # the token went with the logout: no way back in without one
    expect(tab.page.locator("#login")).to_be_visible()
    assert tab.errors == []


def test_durable_session_goes_offline_and_its_missed_count_grows(
        logged_in: LoggedIn, clients: list[PahoClient]) -> None:
    broker, tab = logged_in
    tab.view("clients")
    topic = unique("dur").replace("-", "/")
    durable = paho(clients, broker, session_expiry=3600)
    durable.subscribe(topic + "/#", 1)
    row = tab.client_row(durable.client_id)
    expect(row).to_contain_text("connected")
    durable.disconnect()
    expect(row.locator("td").nth(2)).to_have_text("offline")
    expect(row.locator("td.expires")).to_have_text(re.compile(r"^59m \d+s$|^1h"))
    expect(row.locator("td.missed")).to_have_text("0")
    publisher = paho(clients, broker)
    for n in range(3):
        publisher.publish(f"{topic}/{n}", b"m", qos=1)
    expect(row.locator("td.missed")).to_have_text("3")
    for _ in range(4):
        publisher.publish(f"{topic}/more", b"m", qos=1)
    expect(row.locator("td.missed")).to_have_text("7")


def test_kick_a_client(logged_in: LoggedIn, clients: list[PahoClient]) -> None:
    broker, tab = logged_in
    tab.view("clients")
    victim = paho(clients, broker, session_expiry=3600)
    row = tab.client_row(victim.client_id)
    row.get_by_role("button", name="Kick").click()
    row.get_by_role("button", name="Confirm kick").click()
    assert victim.wait_disconnected() == ADMINISTRATIVE_ACTION
    expect(tab.page.locator("#notice")).to_have_text(f"Kicked {victim.client_id}.")
    expect(row).to_have_count(0)  # the session went too (EMQX's kick)


def test_a_viewer_key_sees_everything_and_changes_nothing(
        dashboard_broker: Callable[..., BrokerProcess], dashboard: OpenDashboard,
        clients: list[PahoClient]) -> None:
    broker = dashboard_broker()
    tab = dashboard(broker)
    tab.log_in(*VIEWER_KEY)
    expect(tab.page.locator("#who")).to_have_text("viewer")
    tab.view("clients")
    client = paho(clients, broker)
    row = tab.client_row(client.client_id)
    expect(row).to_contain_text("connected")
    expect(row.get_by_role("button", name="Kick")).to_be_hidden()
    tab.view("storage")
    expect(tab.page.locator("#db-messages")).to_be_visible()
    expect(tab.page.locator("#seal")).to_be_hidden()


def test_publish_and_receive_on_the_websocket_page(
        logged_in: LoggedIn, clients: list[PahoClient]) -> None:
    broker, tab = logged_in
    tab.view("websocket")
    page = tab.page
    topic = unique("ws").replace("-", "/")
    subscriber = paho(clients, broker)
    subscriber.subscribe(topic + "/from-browser", 1)
    page.fill("#ws-connect input[name=url]", f"ws://127.0.0.1:{broker.ports['ws']}/mqtt")
    page.click("#ws-connect-button")
    expect(page.locator("#ws-status")).to_have_text("connected")
    page.fill("#ws-subscribe input[name=filter]", topic + "/to-browser")
    page.select_option("#ws-subscribe select[name=qos]", "1")
    page.click("#ws-subscribe button")
    expect(page.locator("#ws-subscriptions")).to_contain_text("granted QoS 1")
    page.fill("#ws-publish input[name=topic]", topic + "/from-browser")
    page.fill("#ws-publish input[name=payload]", "hello from chromium")
    page.select_option("#ws-publish select[name=qos]", "1")
    page.click("#ws-publish button")
    assert subscriber.wait_message_on(topic + "/from-browser").payload == b"hello from chromium"
    paho(clients, broker).publish(topic + "/to-browser", XSS.encode(), qos=1)
    message = page.locator("#ws-messages tbody tr").first
    expect(message).to_contain_text(topic + "/to-browser")
    expect(message.locator("td").last).to_have_text(XSS)
    assert page.locator("#ws-messages img").count() == 0
    assert tab.dialogs == []


def test_view_and_delete_a_retained_message(
        logged_in: LoggedIn, clients: list[PahoClient]) -> None:
    broker, tab = logged_in
    topic = unique("ret").replace("-", "/")
    paho(clients, broker).publish(topic, b"kept", qos=1, retain=True,
                                  properties=publish_props(UserProperty=[("site", "north")]))
    tab.view("topics")
    row = tab.page.locator("#retained tbody tr").filter(has_text=topic)
    row.get_by_role("button", name="View").click()
    expect(tab.page.locator("#retained-payload")).to_have_text("kept")
    expect(tab.page.locator("#retained-properties")).to_contain_text("north")
    row.get_by_role("button", name="Delete").click()
    expect(row).to_have_count(0)
    assert call(broker.ports["http"], f"/api/v5/mqtt/retainer/message/{topic}",
                token=None)[0] == 401  # and without a token nothing is told
    late = paho(clients, broker)
    late.subscribe(topic, 1)
    assert late.barrier() == []  # deleted: a new subscriber gets no retained message


def test_client_id_topic_payload_and_user_property_render_as_text(
        logged_in: LoggedIn, clients: list[PahoClient]) -> None:
    broker, tab = logged_in
    tab.view("clients")
    hostile = paho(clients, broker, XSS, session_expiry=600)
    topic = f"xss/<b>{unique('t')}</b>"
    hostile.subscribe(topic, 1)
    hostile.publish(topic, b"<script>alert(2)</script>", qos=1, retain=True,
                    properties=publish_props(UserProperty=[("<i>k</i>", XSS)]))
    row = tab.client_row(XSS)
    expect(row).to_contain_text("connected")
    row.get_by_role("button", name=XSS).click()
    expect(tab.page.locator("#client-subscriptions")).to_contain_text(topic)
    tab.view("subscriptions")
    expect(tab.page.locator("#subscriptions")).to_contain_text(topic)
    tab.view("topics")
    retained = tab.page.locator("#retained tbody tr").filter(has_text=topic)
    retained.get_by_role("button", name="View").click()
    expect(tab.page.locator("#retained-payload")).to_have_text("<script>alert(2)</script>")
    expect(tab.page.locator("#retained-properties tbody td").first).to_have_text("<i>k</i>")
    expect(tab.page.locator("#retained-properties tbody td").last).to_have_text(XSS)
    # Markup would have made elements: none of these exist anywhere on the page.
    for tag in ("img", "script:not([src])", "b", "i"):
        assert tab.page.locator(f"main {tag}").count() == 0, tag
    assert tab.dialogs == []


def test_an_active_alarm_shows_as_a_banner_over_every_view(
        dashboard_broker: Callable[..., BrokerProcess], dashboard: OpenDashboard,
        clients: list[PahoClient]) -> None:
    """The storage quota (256 KiB) crossed by durable messages: the quota alarm's banner
    appears over whatever view is open; none before."""
    broker = dashboard_broker(**{"durable_storage.messages.storage_quota": "256KB"})
    tab = dashboard(broker)
    tab.log_in()
    expect(tab.page.locator("#app")).to_be_visible()
    banner = tab.page.locator("#alarms")
    expect(tab.page.locator("[data-card=Connections]")).to_have_text("0")  # refreshed once
    expect(banner).to_be_hidden()
    topic = unique("quota").replace("-", "/")
    paho(clients, broker, session_expiry=3600).subscribe(topic + "/#", 1)
    # 400 KiB, or fewer if the quota check refuses them on the way (DISCONNECT 0x97).
    publish_until_refused(broker.tcp, unique("pub"), f"{topic}/x", 0, limit=100)
    tab.view("clients")
    expect(banner.locator("[data-alarm=db_storage_quota_exceeded]")).to_contain_text(
        "storage_quota")
    expect(banner).to_be_visible()
    assert tab.errors == []
