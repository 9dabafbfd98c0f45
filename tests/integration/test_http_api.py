"""The HTTP API (`/api/v5/...`, EMQX-shaped) and Prometheus `/metrics`, read with urllib while
real MQTT clients are connected."""

import pytest

from tests.integration.clients import (
    api_client,
    http_get,
    http_json,
    scrape_metrics,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration


def test_status(shared_broker) -> None:
    http = shared_broker.ports["http"]
    for path in ("/status", "/api/v5/status"):
        assert http_json(http, path) == {"node": "broker@127.0.0.1", "status": "running"}


def test_clients_lists_connected_and_offline_sessions(paho_client, shared_broker, topic) -> None:
    http = shared_broker.ports["http"]
    v3 = paho_client(unique("api3"), version=4, keepalive=17)
    v5 = paho_client(unique("api5"), session_expiry=300, keepalive=23)
    v5.subscribe(f"{topic}/a", 1)
    v5.subscribe(f"{topic}/b", 0)

    view = api_client(http, v3.client_id)
    assert view is not None
    assert view["clientid"] == v3.client_id
    assert view["node"] == "broker@127.0.0.1"
    assert (view["connected"], view["proto_ver"], view["keepalive"]) == (True, 4, 17)
    assert view["clean_start"] is True
    assert view["ip_address"].startswith("127.0.0.1:")
    assert (view["subscriptions_cnt"], view["expiry_interval"]) == (0, 0)

    view = api_client(http, v5.client_id)
    assert (view["connected"], view["proto_ver"], view["keepalive"]) == (True, 5, 23)
    assert (view["subscriptions_cnt"], view["expiry_interval"]) == (2, 300)

    listed = http_json(http, "/api/v5/clients?limit=10000")
    ids = [item["clientid"] for item in listed["data"]]
    assert v3.client_id in ids and v5.client_id in ids
    assert ids == sorted(ids)
    assert listed["meta"]["count"] == len(ids)

    v5.disconnect()
    wait_until(lambda: api_client(http, v5.client_id)["connected"] is False,
               what="the API to show the session offline")
    offline = api_client(http, v5.client_id)
    assert (offline["ip_address"], offline["subscriptions_cnt"]) == (None, 2)


def test_clients_paging(paho_client, broker) -> None:
    http = broker.ports["http"]
    ids = sorted(unique(f"page{n}") for n in range(5))
    for client_id in ids:
        paho_client(client_id, port=broker.tcp)
    first = http_json(http, "/api/v5/clients?page=1&limit=2")
    second = http_json(http, "/api/v5/clients?page=2&limit=2")
    last = http_json(http, "/api/v5/clients?page=3&limit=2")
    beyond = http_json(http, "/api/v5/clients?page=4&limit=2")
    assert [c["clientid"] for c in first["data"] + second["data"] + last["data"]] == ids
    assert first["meta"] == {"page": 1, "limit": 2, "count": 5}
    assert beyond["data"] == [] and beyond["meta"]["count"] == 5
    error = http_json(http, "/api/v5/clients?page=x", status=400)
    assert error["code"] == "BAD_REQUEST"


def test_unknown_client_is_404(shared_broker) -> None:
    body = http_json(shared_broker.ports["http"], f"/api/v5/clients/{unique('nobody')}",
                     status=404)
    assert body["code"] == "CLIENTID_NOT_FOUND"


def test_subscriptions(paho_client, shared_broker, topic) -> None:
    client = paho_client()
    client.subscribe(f"{topic}/plain", 2)
    client.subscribe(f"{topic}/opts/#", 1, no_local=True, retain_as_published=True,
                     retain_handling=2, sub_id=12)
    client.subscribe(f"$share/grp/{topic}/shared", 0)
    items = http_json(shared_broker.ports["http"], "/api/v5/subscriptions?limit=10000")["data"]
    mine = {item["topic"]: item for item in items if item["clientid"] == client.client_id}
    assert sorted(mine) == sorted([f"{topic}/plain", f"{topic}/opts/#",
                                   f"$share/grp/{topic}/shared"])
    assert mine[f"{topic}/plain"] | {"clientid": None, "node": None} == {
        "clientid": None, "node": None, "topic": f"{topic}/plain", "qos": 2, "nl": 0,
        "rap": 0, "rh": 0, "share_group": None, "subid": None}
    opts = mine[f"{topic}/opts/#"]
    assert (opts["qos"], opts["nl"], opts["rap"], opts["rh"], opts["subid"]) == (1, 1, 1, 2, 12)
    assert mine[f"$share/grp/{topic}/shared"]["share_group"] == "grp"

    error = http_json(shared_broker.ports["http"], "/api/v5/subscriptions?limit=many",
                      status=400)
    assert error["code"] == "BAD_REQUEST"

    client.unsubscribe(f"{topic}/plain")
    items = http_json(shared_broker.ports["http"], "/api/v5/subscriptions?limit=10000")["data"]
    assert f"{topic}/plain" not in {i["topic"] for i in items if i["clientid"] == client.client_id}


def test_metrics_count_traffic(paho_client, broker) -> None:
    """A broker of its own, so every counter can be checked exactly."""
    http = broker.ports["http"]
    code, headers, _ = http_get(http, "/metrics")
    assert code == 200 and headers["Content-Type"].startswith("text/plain")
    before = scrape_metrics(http)
    assert before["mqtt_connections"] == 0
    assert before['mqtt_messages_received_total{qos="1"}'] == 0

    sub = paho_client(port=broker.tcp)
    sub.subscribe("m/t", 1)
    pub = paho_client(port=broker.tcp)
    for n in range(3):
        pub.publish("m/t", f"{n}".encode(), 1)
    pub.publish("m/t", b"q2", 2)
    pub.publish("m/nobody", b"lost", 0)
    pub.publish("m/keep", b"stored", 1, retain=True)
    sub.wait_messages(4)

    after = scrape_metrics(http)
    assert after["mqtt_connections"] == 2
    assert after["mqtt_connections_accepted_total"] == 2
    assert after['mqtt_messages_received_total{qos="0"}'] == 1
    assert after['mqtt_messages_received_total{qos="1"}'] == 4
    assert after['mqtt_messages_received_total{qos="2"}'] == 1
    assert after['mqtt_messages_sent_total{qos="1"}'] == 4  # QoS 2 downgraded to the sub's 1
    assert after['mqtt_messages_dropped_total{reason="no_subscribers"}'] == 2
    assert after["mqtt_subscriptions"] == 1
    assert after["mqtt_retained_messages"] == 1
    assert after["mqtt_sessions"] == 2
    assert after["mqtt_bytes_received_total"] > before["mqtt_bytes_received_total"]
    assert after["mqtt_bytes_sent_total"] > before["mqtt_bytes_sent_total"]
    # Prometheus' own API path serves the same metrics.
    code, _, text = http_get(http, "/api/v5/prometheus/stats")
    assert code == 200 and b"mqtt_messages_received_total" in text
