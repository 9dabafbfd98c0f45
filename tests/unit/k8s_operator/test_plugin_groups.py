"""`kubectl mqtt groups`: the durable shared groups one broker answers for the whole cluster
(GET /api/v5/durable_shared_groups), as a table, and which pod it asks (no cluster needed:
the API server's pod proxy is stood in for by a fake Kube that answers per pod)."""

import base64
import json
from typing import Any, cast

import pytest
from kubernetes.client.exceptions import ApiException

from mqtt_operator import plugin
from mqtt_operator.kube import Kube
from mqtt_operator.plugin_ask import PluginError

WORKERS = {
    "group": "workers", "filter": "jobs/#", "topic": "$share/workers/jobs/#",
    "since": 1765000000000000,
    "members": [
        {"clientid": "w2", "node": "site-b", "connected": False, "shards": []},
        {"clientid": "w1", "node": "site-a", "connected": True, "shards": [0, 3, 5]},
        {"clientid": "w3", "node": "site-a", "connected": True, "shards": [1, 2, 4]},
    ],
    "backlog": 123,
    "streams": [{"shard": 0, "generation": 2, "stream": 77, "owner": "w1", "backlog": 12},
                {"shard": 6, "generation": 2, "stream": 80, "owner": None, "backlog": 111}],
}
# Sorts before `workers`; its members all gone: the case the backlog alert is about.
ALERTS = {"group": "alerts", "filter": "sensors/+/alarm", "topic": "$share/alerts/sensors/+/alarm",
          "since": 1765000000000001,
          "members": [{"clientid": "a1", "node": "site-c", "connected": False, "shards": []}],
          "backlog": 4567, "streams": []}


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()[2:]]


def test_groups_table_counts_connected_members_and_names_their_nodes() -> None:
    text = plugin.render_groups("web-1", {"data": [WORKERS, ALERTS], "meta": {"count": 2}})
    lines = text.splitlines()
    assert lines[0] == "DURABLE SHARED GROUPS (as web-1 sees them):"
    assert lines[1].split() == ["GROUP", "FILTER", "MEMBERS", "BACKLOG", "NODES"]
    assert rows(text) == [["alerts", "sensors/+/alarm", "0/1", "4567", "site-c"],
                          ["workers", "jobs/#", "2/3", "123", "site-a", "site-b"]]
    # Columns line up: every row's BACKLOG starts where the header's does.
    column = lines[1].index("BACKLOG")
    assert all(line[column:].split()[0] in ("BACKLOG", "4567", "123") for line in lines[1:])
    assert text.endswith("\n")


def test_groups_without_members_backlog_or_any_group_at_all() -> None:
    bare = {"group": "g", "filter": "a/b", "members": [], "backlog": None, "streams": []}
    assert rows(plugin.render_groups("web-0", {"data": [bare], "meta": {"count": 1}})) == [
        ["g", "a/b", "0/0", "-", "-"]]
    empty = plugin.render_groups("web-0", {"data": [], "meta": {"count": 0}})
    assert empty.splitlines()[1:] == ["GROUP  FILTER  MEMBERS  BACKLOG  NODES", "(none)"]


def test_groups_say_when_only_some_are_listed() -> None:
    text = plugin.render_groups("web-0", {"data": [WORKERS], "meta": {"count": 5}})
    assert text.splitlines()[-1] == "(the first 1 of 5)"


def test_groups_nodes_are_pods_where_the_status_knows_the_site() -> None:
    named = {**WORKERS, "members": [*WORKERS["members"], {
        "clientid": "w4", "node": "broker@web-9.web-headless", "connected": True}]}
    text = plugin.render_groups("web-0", {"data": [named]}, {"site-a": "web-0"})
    assert rows(text) == [["workers", "jobs/#", "3/4", "123",
                           "broker@web-9.web-headless", "site-b", "web-0"]]


def test_only_the_groups_envelope_is_read_as_groups() -> None:
    assert plugin._is_groups({"data": [WORKERS, ALERTS], "meta": {"count": 2}})
    assert plugin._is_groups({"data": [], "meta": {"count": 0}})
    assert not plugin._is_groups({"data": [{"clientid": "c1"}], "meta": {}})  # a clients page
    assert not plugin._is_groups([WORKERS])
    assert not plugin._is_groups({"data": [{**WORKERS, "members": "w1"}]})
    assert not plugin._is_groups({"code": "NOT_FOUND", "message": "no such path"})


class PodProxy:
    """Kube as the plugin uses it: the cluster's key Secret, and per pod either an answer
    or an HTTP status from its broker (the API server's proxy passing it on)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, Any, Any]] = []

    def get(self, url: str) -> Any:
        assert url == "/api/v1/namespaces/demo/secrets/web-api-key", url
        encoded = {key: base64.b64encode(value.encode()).decode()
                   for key, value in (("username", "viewer"), ("password", "s3cret"))}
        return {"data": encoded}

    def request(self, method: str, url: str, body: Any = None, content_type: Any = None,
                query: Any = None, headers: Any = None) -> Any:
        assert method == "GET"
        self.asked.append((url, query, headers))
        pod = url.split("/pods/", 1)[1].split(":", 1)[0]
        answer = self.answers[pod]
        if isinstance(answer, int):
            raise ApiException(status=answer, reason="Not Found")
        return answer


CLUSTER = {"metadata": {"name": "web", "namespace": "demo"},
           "spec": {"listeners": {"httpPort": 18083}},
           "status": {"sites": [{"id": "site-a", "pod": "web-0", "state": "down"},
                                {"id": "site-b", "pod": "web-1", "state": "up"},
                                {"id": "site-z", "pod": "web-2", "state": "up"}]}}


def test_groups_asks_one_ready_pod_after_another_until_one_answers() -> None:
    page = {"data": [WORKERS], "meta": {"count": 1}}
    # web-1 is Ready but runs a broker without the endpoint (404): web-2 answers for all.
    kube = PodProxy({"web-0": page, "web-1": 404, "web-2": page})
    text = plugin.ask_brokers(cast(Kube, kube), CLUSTER, "groups", json_output=False)
    assert text.splitlines()[0] == "DURABLE SHARED GROUPS (as web-2 sees them):"
    # NODES: the pod of each site the broker names (the cluster's status says which).
    assert rows(text) == [["workers", "jobs/#", "2/3", "123", "web-0", "web-1"]]
    assert [url for url, _, _ in kube.asked] == [
        f"/api/v1/namespaces/demo/pods/{pod}:18083/proxy/api/v5/durable_shared_groups"
        for pod in ("web-1", "web-2")]
    assert all(headers == {"X-Api-Key": "viewer:s3cret"} for _, _, headers in kube.asked)

    document = json.loads(plugin.ask_brokers(cast(Kube, PodProxy({"web-1": page})), CLUSTER,
                                             "groups", json_output=True))
    assert document == {"cluster": "web", "pod": "web-1", "groups": page}


def test_groups_when_no_broker_answers_says_why_each_did_not() -> None:
    kube = PodProxy({"web-0": 404, "web-1": 404, "web-2": {"unexpected": True}})
    with pytest.raises(PluginError) as raised:
        plugin.ask_brokers(cast(Kube, kube), CLUSTER, "groups", json_output=False)
    message = str(raised.value)
    assert message.startswith("no broker answered GET /api/v5/durable_shared_groups: ")
    assert "web-1: 404" in message and "web-0: 404" in message
    assert "web-2: unreadable answer" in message


def test_groups_is_a_verb_of_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        plugin.main(["--help"])
    assert "groups" in capsys.readouterr().out
