"""When a cluster is reconciled again without an event (operator/mqtt_operator/resync.py)."""

import threading

from mqtt_operator import resync


def test_a_wait_on_the_brokers_comes_before_the_spark_poll_and_settled_means_none() -> None:
    assert resync.delay(True, True, 5, 30) == 5
    assert resync.delay(False, True, 5, 30) == 30
    assert resync.delay(False, False, 5, 30) is None


def test_the_last_decision_per_cluster_replaces_earlier_ones() -> None:
    schedule = resync.Schedule()
    schedule.set(("ns", "a"), 5, now=100)
    schedule.set(("ns", "b"), 30, now=100)
    assert schedule.wait(now=101) == 4
    schedule.set(("ns", "a"), None, now=102)  # settled meanwhile: not due any more
    assert schedule.wait(now=102) == 28
    assert schedule.take(now=129) == []
    assert schedule.take(now=131) == [("ns", "b")]
    assert schedule.wait(now=131) is None  # taken: its reconcile schedules it again


def test_overdue_clusters_are_taken_together_and_wait_is_never_negative() -> None:
    schedule = resync.Schedule()
    schedule.set(("ns", "b"), 1, now=0)
    schedule.set(("ns", "a"), 2, now=0)
    assert schedule.wait(now=10) == 0
    assert schedule.take(now=10) == [("ns", "a"), ("ns", "b")]


def test_the_thread_runs_a_due_cluster_once_and_stops() -> None:
    ran: list[resync.Key] = []
    done = threading.Event()

    def reconcile(key: resync.Key) -> None:
        ran.append(key)
        done.set()

    thread = resync.Resync(reconcile)
    thread.start()
    try:
        thread.after(("ns", "later"), 3600)
        thread.after(("ns", "now"), 0)  # wakes the thread out of its hour-long wait
        assert done.wait(10)
    finally:
        thread.stop()
    assert ran == [("ns", "now")]
