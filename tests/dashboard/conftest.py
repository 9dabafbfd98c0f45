"""A broker with API keys, a headless Debian chromium driven by Playwright, and HTTP helpers.

The broker asks for keys (a bootstrap file), so every request the page makes must carry
its login's token as on a production node; its listeners bind loopback, so the default
password logs in. The browser is the system's chromium (`executable_path`): Playwright
never downloads one.
"""

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from tests.integration.clients import PahoClient, unique
from tests.support.broker_process import BrokerProcess

ADMIN_KEY = ("ops", "admin-secret-1")
VIEWER_KEY = ("grafana", "viewer-secret-2")
UI_TIMEOUT_MS = 10_000

expect.set_options(timeout=UI_TIMEOUT_MS)


@pytest.fixture
def dashboard_broker(start_broker: Callable[..., BrokerProcess],
                     tmp_path: Path) -> Callable[..., BrokerProcess]:
    """dashboard_broker(**settings): a broker whose API asks for keys."""
    keys = tmp_path / "keys"
    keys.write_text(f"{':'.join(ADMIN_KEY)}\n{':'.join(VIEWER_KEY)}:viewer\n")

    def start(**settings: str) -> BrokerProcess:
        return start_broker(tmp_path / "data", **{"api_key.bootstrap_file": str(keys),
                                                  **settings})

    return start


def call(port: int, path: str, method: str = "GET", *, token: str | None = None,
         body: Any = None) -> tuple[int, Any]:
    """(status, body) of one request, with `token` as a Bearer: JSON parsed, other text as
    it is, None when empty."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, kind, raw = response.status, response.headers.get_content_type(), \
                response.read()
    except urllib.error.HTTPError as error:
        status, kind, raw = error.code, error.headers.get_content_type(), error.read()
    if not raw:
        return status, None
    return status, json.loads(raw) if kind == "application/json" else raw.decode()


def paho(clients: list[PahoClient], broker: BrokerProcess, client_id: str | None = None,
         **connect: Any) -> PahoClient:
    """A connected paho v5 client, closed at teardown (`clients`)."""
    client = PahoClient(broker.tcp, client_id or unique("paho"))
    clients.append(client)
    client.connect(**connect)
    return client


def login(port: int, username: str = "admin", password: str = "public") -> str:
    status, body = call(port, "/api/v5/login", "POST",
                        body={"username": username, "password": password})
    assert status == 200, body
    return str(body["token"])


# Per module, not per session: Playwright's sync driver holds an event loop on the main
# thread while it runs, and pytest-asyncio's tests cannot start theirs beside it.
@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is missing: make install brings it"
    # --no-sandbox: chromium's sandbox cannot start as root, which the test machines are.
    launched = playwright.chromium.launch(executable_path=executable, headless=True,
                                          args=["--no-sandbox"])
    yield launched
    launched.close()


class Dashboard:
    """One browser tab on a broker's dashboard; `dialogs` collects any alert() a page
    managed to run (the XSS check)."""

    def __init__(self, page: Page, port: int) -> None:
        self.page = page
        self.port = port
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda error: self.errors.append(str(error)))

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, view: str = "") -> None:
        self.page.goto(f"http://127.0.0.1:{self.port}/#{view}")

    def log_in(self, username: str = "admin", password: str = "public") -> None:
        self.open()
        self.page.fill("#login input[name=username]", username)
        self.page.fill("#login input[name=password]", password)
        self.page.click("#login button[type=submit]")

    def view(self, name: str) -> None:
        self.page.click(f"nav a[href='#{name}']")
        expect(self.page.locator(f"#view-{name}")).to_be_visible()

    def client_row(self, client_id: str) -> Any:
        return self.page.locator("#clients tbody tr").filter(
            has=self.page.get_by_role("button", name=client_id, exact=True))


@pytest.fixture
def dashboard(browser: Browser) -> Iterator[Callable[[BrokerProcess], Dashboard]]:
    """dashboard(broker): a fresh tab (own storage: logged out) on the broker's dashboard."""
    contexts = []

    def open_tab(broker: BrokerProcess) -> Dashboard:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        return Dashboard(context.new_page(), broker.ports["http"])

    yield open_tab
    for context in contexts:
        context.close()


@pytest.fixture
def logged_in(dashboard_broker: Callable[..., BrokerProcess],
              dashboard: Callable[[BrokerProcess], Dashboard]) -> tuple[BrokerProcess, Dashboard]:
    """A broker, and a tab logged in to it as the administrator."""
    broker = dashboard_broker()
    tab = dashboard(broker)
    tab.log_in()
    expect(tab.page.locator("#app")).to_be_visible()
    return broker, tab
