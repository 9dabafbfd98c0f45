"""How `kubectl mqtt clients | sessions | generations` lay out what brokers answer, in the
cases a small live cluster does not show: more clients than one page, sessions that never
expire, replicas that disagree about a generation."""

from mqtt_operator import plugin


def test_clients_say_when_only_the_first_page_is_listed() -> None:
    page = {"data": [{"clientid": "c1", "node": "n1", "connected": True, "proto_ver": 4,
                      "durable": False, "subscriptions_cnt": 2, "inflight_cnt": 0,
                      "mqueue_len": 0}], "meta": {"page": 1, "limit": 1, "count": 7}}
    lines = plugin.render_clients("web-0", page).splitlines()
    assert lines[2].split() == ["c1", "n1", "connected", "3.1.1", "no", "2", "0", "0"]
    assert lines[-1] == "(the first 1 of 7)"


def test_sessions_expiry_by_the_brokers_clock() -> None:
    base = {"node": "n1", "subscriptions_cnt": 1, "inflight_cnt": 0, "checkpoint_lag": 4,
            "now": 1000.0}
    answers = {"web-1": {"data": [
        {**base, "clientid": "b", "connected": False, "expires_at": 1000.0 + 90,
         "missed_cnt": 10000, "missed_capped": True},
        {**base, "clientid": "a", "connected": False, "expires_at": None, "missed_cnt": 0}]},
        "web-0": {"data": [{**base, "clientid": "c", "connected": True, "missed_cnt": 0}]}}
    rows = [line.split() for line in plugin.render_sessions(
        plugin.merged_sessions(answers)).splitlines()[2:]]
    assert [(row[0], row[3], row[-1]) for row in rows] == [
        ("a", "never", "0"), ("b", "1m30s", "10000+"), ("c", "-", "0")]


def test_generations_merge_replicas_and_keep_disagreements() -> None:
    def storages(state: str) -> dict[str, object]:
        return {"databases": [
            {"name": "messages", "shards": [{"shard": 3, "generations": [
                {"generation": 1, "state": state, "since": 0, "until": None,
                 "messages": 5, "bytes": 50}]}]},
            {"name": "sessions", "n_shards": 1}]}

    merged = plugin.merged_generations({"web-0": storages("sealed"),
                                        "web-1": storages("current"),
                                        "web-2": storages("sealed")})
    assert [(g["state"], g["pods"]) for g in merged] == [
        ("current", ["web-1"]), ("sealed", ["web-0", "web-2"])]
    rows = plugin.render_generations(merged).splitlines()
    assert rows[3].split() == ["messages/3", "1", "sealed", "-", "-", "5", "50", "web-0",
                               "web-2"]
