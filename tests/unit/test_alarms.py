"""The alarm registry: raised once while active (the first cause stays), cleared into a
bounded history, reported to its listener at each change, and exported as one gauge per
alarm, every known one from the start; and its `$SYS` message."""

import json

from broker.alarms import DISK_FULL, HISTORY, QUOTA, Alarm, Alarms
from broker.sys_topics import alarm_message


def test_an_alarm_is_raised_once_and_cleared_into_the_history() -> None:
    changes: list[tuple[str, bool]] = []
    alarms = Alarms("n1@host", lambda alarm: changes.append((alarm.name, alarm.activated)))
    assert {labels["alarm"]: value for _, _, _, labels, value in alarms.samples()} == {
        DISK_FULL: 0.0, QUOTA: 0.0}
    assert alarms.activate(DISK_FULL, "no space", {"path": "/data"})
    assert not alarms.activate(DISK_FULL, "no space again", {})
    assert [a.message for a in alarms.listed(True)] == ["no space"]
    assert {labels["alarm"]: value for _, _, _, labels, value in alarms.samples()}[
        DISK_FULL] == 1.0
    assert alarms.deactivate(DISK_FULL)
    assert not alarms.deactivate(DISK_FULL)
    assert changes == [(DISK_FULL, True), (DISK_FULL, False)]
    assert alarms.listed(True) == []
    cleared = alarms.listed(False)[0].to_json()
    assert cleared["activated"] is False and cleared["deactivate_at"] != "infinity"
    assert cleared["details"] == {"path": "/data"} and cleared["node"] == "n1@host"


def test_the_history_keeps_the_newest_cleared_alarms() -> None:
    alarms = Alarms("n1@host")
    for i in range(HISTORY + 5):
        alarms.activate(f"a{i}", "m")
        alarms.deactivate(f"a{i}")
    cleared = alarms.listed(False)
    assert len(cleared) == HISTORY and cleared[0].name == f"a{HISTORY + 4}"


def test_the_sys_message_names_the_change_and_carries_the_alarm() -> None:
    alarm = Alarm(DISK_FULL, "no space", {}, 1.0, node="n1@host")
    message = alarm_message("n1@host", alarm)
    assert message.topic == "$SYS/brokers/n1@host/alarms/activate"
    assert json.loads(message.payload)["name"] == DISK_FULL
    alarm.deactivate_at = 2.0
    assert alarm_message("n1@host", alarm).topic == "$SYS/brokers/n1@host/alarms/deactivate"
    assert json.loads(alarm_message("n1@host", alarm).payload)["duration"] == 1000
