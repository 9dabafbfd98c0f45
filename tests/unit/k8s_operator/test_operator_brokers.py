"""Asking brokers about their sites, and the drain policy built on the answers."""

import base64
import contextlib
import http.server
import json
import socket
import threading
from collections.abc import Iterator

import pytest

from mqtt_operator.brokers import (
    SiteReport,
    ask_sealed,
    ask_site,
    drain_verdict,
    settled,
    still_held,
)
from mqtt_operator.placement import Transition

SITE_A = {"up": True, "shards": [
    {"storage": "messages", "id": "1"}, {"storage": "messages", "id": "3"},
    {"storage": "sessions", "id": "0"}]}
# The broker's own shape (broker/ds: Storage.info), trimmed to what the operator reads.
STORAGES = {"site_id": "A", "databases": [
    {"name": "messages", "shards": [
        {"shard": 0, "generations": [{"generation": 1, "state": "sealed"},
                                     {"generation": 2, "state": "current"}]},
        {"shard": 2, "generations": [{"generation": 4, "state": "sealed"}]}]},
    {"name": "sessions", "shards": [
        {"shard": 0, "generations": [{"generation": 9, "state": "sealed"}]}]}]}


KEY = ("viewer", "v-secret")


@contextlib.contextmanager
def serving(path: str, answer: object) -> Iterator[int]:
    """A local HTTP server answering `answer` at `path` to a request with `KEY` as HTTP
    Basic, as a broker of contract v3 does; 401 without it, 404 elsewhere."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            basic = "Basic " + base64.b64encode(":".join(KEY).encode()).decode()
            if self.headers.get("Authorization") != basic:
                self.send_error(401)
                return
            if self.path != path:
                self.send_error(404)
                return
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def broker() -> Iterator[int]:
    """Site A holds shards 1 and 3."""
    with serving("/api/v5/ds/sites/A", SITE_A) as port:
        yield port


@pytest.fixture
def storages() -> Iterator[int]:
    with serving("/api/v5/ds/storages", STORAGES) as port:
        yield port


def test_reachable_site_reports_its_message_shards(broker: int) -> None:
    assert ask_site("127.0.0.1", broker, "A", KEY, 2).shards == frozenset({1, 3})


def test_endpoint_missing_refused_no_ip_or_key_refused_is_unreachable(broker: int) -> None:
    not_served = ask_site("127.0.0.1", broker, "B", KEY, 2)
    assert not not_served.reachable and "404" in not_served.error
    with closed_port() as port:
        refused = ask_site("127.0.0.1", port, "A", KEY, 2)
    assert not refused.reachable and "refused" in refused.error.lower()
    assert ask_site(None, broker, "A", KEY, 2).error == "pod has no IP"
    for key in (None, ("viewer", "wrong")):
        unknown = ask_site("127.0.0.1", broker, "A", key, 2)
        assert not unknown.reachable and "HTTP 401" in unknown.error


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


HOLDING = SiteReport("A", frozenset({2}))
EMPTY = SiteReport("B", frozenset())
SILENT = SiteReport("C", None, "connection refused")


@pytest.mark.parametrize(("reports", "require", "proceed", "reason"), [
    ([EMPTY], False, True, "DrainConfirmed"),
    ([EMPTY, HOLDING], False, False, "DrainPending"),
    ([HOLDING, SILENT], False, False, "DrainPending"),
    ([EMPTY, SILENT], False, True, "DrainUnconfirmed"),
    ([EMPTY, SILENT], True, False, "DrainUnconfirmed"),
])
def test_drain_policy(reports: list[SiteReport], require: bool, proceed: bool,
                      reason: str) -> None:
    verdict = drain_verdict(reports, require)
    assert (verdict.proceed, verdict.reason) == (proceed, reason)


def test_a_gone_site_leaves_once_an_answering_broker_holds_it_in_no_group() -> None:
    assert still_held(SiteReport("old", frozenset({2, 5})))
    assert still_held(SiteReport("old", None, "pod has no IP"))  # no one could tell
    assert not still_held(SiteReport("old", frozenset()))


def test_transition_settles_when_added_sites_hold_and_removed_members_do_not() -> None:
    move = Transition(2, add=("A",), remove=("B",))
    assert settled(move, {"A": HOLDING, "B": EMPTY}, {"A", "B"})
    assert settled(move, {"A": HOLDING}, {"A"})  # B has left the cluster
    assert not settled(move, {"A": HOLDING, "B": SILENT}, {"A", "B"})
    assert not settled(move, {"A": EMPTY, "B": EMPTY}, {"A", "B"})


def test_sealed_generations_of_the_messages_database(storages: int) -> None:
    assert ask_sealed("127.0.0.1", storages, KEY, 2) == frozenset({(0, 1), (2, 4)})
    with closed_port() as port:
        assert ask_sealed("127.0.0.1", port, KEY, 2) is None
    assert ask_sealed(None, storages, KEY, 2) is None
    assert ask_sealed("127.0.0.1", storages, None, 2) is None
