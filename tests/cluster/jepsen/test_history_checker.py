"""The history checkers on hand-made histories: each rule passes a correct history and fails
one that breaks it; `check` for subscribers that each get every message, `check_shared` for
the members of one shared subscription. Pure: no broker, no sockets."""

from tests.cluster.jepsen.history import (
    EXAMPLES,
    Ack,
    Attempt,
    Connected,
    Delivered,
    Ended,
    Event,
    Fail,
    Key,
    Nemesis,
    Report,
    SharedReport,
    Subscribed,
    check,
    check_shared,
    parse_payload,
    payload,
)


class H:
    """A history builder: one call per event, in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def sub(self, subscriber: str = "s1", node: str = "n1") -> "H":
        self.events += [Connected(subscriber, node, False), Subscribed(subscriber, node)]
        return self

    def connect(self, subscriber: str = "s1", present: bool = True, node: str = "n1") -> "H":
        self.events.append(Connected(subscriber, node, present))
        return self

    def pub(self, seq: int, qos: int = 1, publisher: str = "p1", conn: int = 1) -> "H":
        self.events.append(Attempt(publisher, seq, qos, "n2", conn))
        return self

    def ack(self, seq: int, publisher: str = "p1", conn: int = 1) -> "H":
        self.events.append(Ack(publisher, seq, conn))
        return self

    def fail(self, seq: int, publisher: str = "p1", conn: int = 1) -> "H":
        self.events.append(Fail(publisher, seq, conn))
        return self

    def got(self, seq: int, qos: int = 1, dup: bool = False, publisher: str = "p1",
            subscriber: str = "s1") -> "H":
        self.events.append(Delivered(subscriber, publisher, seq, qos, dup, "n1"))
        return self

    def end(self, subscriber: str = "s1", dropped: tuple[Key, ...] = ()) -> "H":
        """The workload ends the member's session: Clean Start 1 next, then SUBSCRIBE."""
        self.events.append(Ended(subscriber, "n1", dropped))
        return self.sub(subscriber)

    def check(self) -> Report:
        return check(self.events)

    def shared(self) -> SharedReport:
        return check_shared(self.events)


def test_a_correct_history_is_ok() -> None:
    history = H().sub().sub("s2")
    for seq in (1, 2, 3):
        history.pub(seq, qos=1 + seq % 2).ack(seq)
    for subscriber in ("s1", "s2"):
        for seq in (1, 2, 3):
            history.got(seq, qos=1 + seq % 2, subscriber=subscriber)
    history.events.append(Nemesis("kill", "n3"))
    report = history.check()
    assert report.ok, report.summary()
    assert (report.attempted, report.acknowledged, report.unknown, report.delivered,
            report.subscribers) == (3, 3, 0, 6, 2)
    assert report.violations() == {}
    assert "violations: none" in report.summary()


# ---- lost -------------------------------------------------------------------------------------
def test_an_acknowledged_message_never_delivered_is_lost() -> None:
    report = H().sub().pub(1).ack(1).pub(2).ack(2).got(1).check()
    assert not report.ok
    assert report.lost == 1
    assert report.lost_messages == [("s1", "p1", 2, 4, 5)]
    assert report.examples["lost"] == ["s1 never got p1:2 (QoS 1, acknowledged, event 5)"]


def test_lost_counts_per_subscriber() -> None:
    report = H().sub("s1").sub("s2").pub(1).ack(1).got(1, subscriber="s1").check()
    assert report.lost == 1 and report.lost_messages[0][0] == "s2"


def test_a_message_published_before_the_subscription_is_not_expected() -> None:
    report = H().pub(1).ack(1).sub().pub(2).ack(2).got(2).check()
    assert report.ok and report.lost == 0


def test_a_subscriber_that_never_subscribed_expects_nothing() -> None:
    report = H().connect("s9", present=False).sub().pub(1).ack(1).got(1).check()
    assert report.ok, report.summary()


def test_an_unacknowledged_message_may_be_missing_or_recovered() -> None:
    report = H().sub().pub(1).fail(1).pub(2, conn=2).fail(2, conn=2).got(2).check()
    assert report.ok, report.summary()
    assert (report.unknown, report.recovered, report.lost) == (2, 1, 0)


def test_acknowledged_on_a_later_connection_counts_as_acknowledged() -> None:
    report = H().sub().pub(1).fail(1).pub(1, conn=2).ack(1, conn=2).check()
    assert report.lost == 1 and report.acknowledged == 1 and report.recovered == 0
    assert report.resent == 1 and report.unknown == 0


# ---- order ------------------------------------------------------------------------------------
def test_acknowledged_before_the_next_was_sent_must_arrive_first() -> None:
    ok = H().sub().pub(1).ack(1).pub(2).ack(2).got(1).got(2).check()
    assert ok.ok
    bad = H().sub().pub(1).ack(1).pub(2).ack(2).got(2).got(1).check()
    assert not bad.ok and bad.reordered == 1
    assert bad.examples["reordered"] == [
        "s1 got p1:1 after p1:2, though the broker had it first"]


def test_pipelined_on_one_connection_must_keep_order() -> None:
    """Both sent before either acknowledgement: TCP order on the connection decides."""
    bad = H().sub().pub(1).pub(2).ack(1).ack(2).got(2).got(1).check()
    assert bad.reordered == 1 and not bad.ok


def test_a_message_the_broker_may_not_have_had_may_come_later() -> None:
    """1 went out on a connection that died; 2 was sent on the next one and acknowledged;
    1 reaching the subscriber later (the old node had it after all) breaks no promise."""
    report = H().sub().pub(1).fail(1).pub(2, conn=2).ack(2, conn=2).got(2).got(1).check()
    assert report.ok, report.summary()
    assert report.recovered == 1


def test_a_resent_message_acknowledged_on_its_new_connection_keeps_order_there() -> None:
    history = H().sub().pub(1).fail(1).pub(1, conn=2).pub(2, conn=2).ack(1, conn=2)
    assert history.ack(2, conn=2).got(1).got(2).check().ok
    history = H().sub().pub(1).fail(1).pub(1, conn=2).pub(2, conn=2).ack(1, conn=2)
    assert history.ack(2, conn=2).got(2).got(1).check().reordered == 1


def test_redeliveries_do_not_count_for_order() -> None:
    report = (H().sub().pub(1).ack(1).pub(2).ack(2).got(1).got(2).got(1, dup=True)
              .check())
    assert report.ok, report.summary()
    assert report.qos1_duplicates == 1


def test_order_is_per_publisher() -> None:
    history = H().sub().pub(1, publisher="a").ack(1, publisher="a")
    history.pub(1, publisher="b").ack(1, publisher="b")
    report = history.got(1, publisher="b").got(1, publisher="a").check()
    assert report.ok, report.summary()


def test_order_is_per_qos() -> None:
    """MQTT-4.6.0-6 orders PUBLISHes of the same topic and QoS; paho hands a QoS 2 message
    over on PUBREL, after a QoS 1 one the broker sent after it."""
    history = H().sub().pub(1, qos=2).ack(1).pub(2, qos=1).ack(2)
    assert history.got(2, qos=1).got(1, qos=2).check().ok
    history = H().sub().pub(1, qos=2).ack(1).pub(2, qos=1).ack(2).pub(3, qos=2).ack(3)
    report = history.got(2, qos=1).got(3, qos=2).got(1, qos=2).check()
    assert report.reordered == 1 and not report.ok


def test_only_expected_messages_count_for_order() -> None:
    """1 was published before the subscription: it may come late (or never)."""
    report = H().pub(1).ack(1).sub().pub(2).ack(2).got(2).got(1).check()
    assert report.ok, report.summary()


# ---- duplicates -------------------------------------------------------------------------------
def test_qos2_delivered_twice_is_a_violation() -> None:
    report = H().sub().pub(1, qos=2).ack(1).got(1, qos=2).got(1, qos=2, dup=True).check()
    assert not report.ok
    assert report.qos2_duplicates == 1 and report.missing_dup == 0
    assert report.examples["qos2_duplicates"] == ["s1 got QoS 2 p1:1 again (dup=True, at n1)"]


def test_qos2_sent_again_on_a_new_connection_may_arrive_twice() -> None:
    report = (H().sub().pub(1, qos=2).fail(1).pub(1, qos=2, conn=2).ack(1, conn=2)
              .got(1, qos=2).got(1, qos=2).check())
    assert report.ok, report.summary()
    assert (report.resend_duplicates, report.qos2_duplicates) == (1, 0)


def test_qos1_duplicates_are_counted_not_violations() -> None:
    report = H().sub().pub(1).ack(1).got(1).got(1, dup=True).got(1, dup=True).check()
    assert report.ok and report.qos1_duplicates == 2


def test_a_redelivery_without_dup_is_a_violation() -> None:
    report = H().sub().pub(1).ack(1).got(1).got(1, dup=False).check()
    assert not report.ok
    assert report.missing_dup == 1 and report.qos1_duplicates == 1


def test_copies_of_a_message_sent_twice_need_no_dup() -> None:
    report = H().sub().pub(1).fail(1).pub(1, conn=2).ack(1, conn=2).got(1).got(1).check()
    assert report.ok, report.summary()


# ---- unexpected -------------------------------------------------------------------------------
def test_a_delivery_never_published_is_unexpected() -> None:
    report = H().sub().pub(1).ack(1).got(1).got(7).check()
    assert not report.ok and report.unexpected == 1
    assert "never published" in report.examples["unexpected"][0]


def test_an_unreadable_payload_is_unexpected() -> None:
    report = H().sub().got(-1, publisher="").check()
    assert report.unexpected == 1 and not report.ok


def test_a_delivery_with_another_qos_is_unexpected() -> None:
    report = H().sub().pub(1, qos=2).ack(1).got(1, qos=1).check()
    assert report.unexpected == 1 and not report.ok


# ---- sessions ---------------------------------------------------------------------------------
def test_session_present_0_after_subscribing_is_a_lost_session() -> None:
    ok = H().sub().connect(present=True).check()
    assert ok.ok
    bad = H().sub().connect(present=True).connect(present=False, node="n3").check()
    assert not bad.ok and bad.sessions_lost == 1
    assert bad.examples["sessions_lost"] == [
        "s1 reconnected at n3 with Session Present 0 (event 3)"]


def test_a_session_begun_again_is_lost_only_once_it_holds_a_subscription() -> None:
    """Ended, the next session is new (Session Present 0) and holds nothing until its
    SUBACK: a crash before it may lose that empty session; after it, not."""
    history = H().sub().connect(present=True).end().connect(present=False)
    assert history.check().sessions_lost == 1  # (end() subscribed the new session)
    ended = H().sub()
    ended.events += [Ended("s1", "n1", ()), Connected("s1", "n1", False),
                     Connected("s1", "n2", False)]  # killed before its SUBSCRIBE
    assert ended.check().sessions_lost == 0
    assert ended.sub().connect(present=False).check().sessions_lost == 1
    lost_twice = H().sub().connect(present=False).connect(present=False).sub()
    assert lost_twice.connect(present=False).check().sessions_lost == 2


def test_after_a_lost_session_redeliveries_without_dup_are_not_blamed_twice() -> None:
    report = (H().sub().pub(1).ack(1).got(1).connect(present=False).got(1).check())
    assert report.sessions_lost == 1 and report.missing_dup == 0


# ---- the report -------------------------------------------------------------------------------
def test_examples_are_capped() -> None:
    history = H().sub()
    for seq in range(1, 20):
        history.pub(seq).ack(seq)
    report = history.check()
    assert report.lost == 19 and len(report.examples["lost"]) == EXAMPLES
    assert report.violations() == {"lost": 19}
    assert "lost=19" in report.summary()


def test_payloads_name_their_message() -> None:
    assert parse_payload(payload("p3", 17)) == ("p3", 17)
    assert parse_payload(b"p:x:4") == ("p:x", 4)
    assert parse_payload(b"junk") is None
    assert parse_payload(b"\xff:1") is None


# ---- shared subscriptions ---------------------------------------------------------------------
def test_each_message_at_one_member_is_ok() -> None:
    history = H().sub("s1").sub("s2")
    for seq in (1, 2, 3, 4):
        history.pub(seq, qos=1 + seq % 2).ack(seq)
        history.got(seq, qos=1 + seq % 2, subscriber="s1" if seq < 3 else "s2")
    report = history.shared()
    assert report.ok, report.summary()
    assert (report.acknowledged, report.delivered, report.subscribers) == (4, 4, 2)
    assert "violations: none" in report.summary()
    assert "redelivered=0" in report.summary()


def test_a_job_delivered_to_two_members_is_flagged() -> None:
    report = H().sub("s1").sub("s2").pub(1).ack(1).got(1, subscriber="s1").got(
        1, subscriber="s2").shared()
    assert not report.ok
    assert report.violations() == {"doubled": 1}
    assert report.examples["doubled"] == [
        "s2#1 got p1:1 (event 7) while s1#1 had it (event 6) and its session"]
    assert "doubled=1" in report.summary()


def test_a_qos2_job_delivered_to_two_members_is_flagged() -> None:
    report = H().sub("s1").sub("s2").pub(1, qos=2).ack(1).got(1, qos=2, subscriber="s2").got(
        1, qos=2, subscriber="s1").shared()
    assert report.violations() == {"qos2_doubled": 1}
    assert report.examples["qos2_doubled"] == [
        "s1#1 got QoS 2 p1:1 (event 7), which s2#1 got too (event 6)"]


def test_qos1_jobs_of_an_ended_member_may_go_to_another_once_without_dup() -> None:
    history = H().sub("s1").sub("s2").pub(1).ack(1).got(1, subscriber="s1").end("s1")
    report = history.got(1, subscriber="s2").shared()
    assert report.ok, report.summary()
    assert (report.ended, report.redelivered, report.doubled) == (1, 1, 0)
    assert report.sessions_lost == 0  # Session Present 0 after an end: a new session


def test_a_redelivery_to_a_new_member_with_dup_is_flagged() -> None:
    history = H().sub("s1").sub("s2").pub(1).ack(1).got(1, subscriber="s1").end("s1")
    report = history.got(1, dup=True, subscriber="s2").shared()
    assert report.violations() == {"wrong_dup": 1} and report.redelivered == 1
    # ... unless that member's connection broke since: it may have been sent before.
    history = H().sub("s1").sub("s2").pub(1).ack(1).got(1, subscriber="s1").end("s1")
    report = history.connect("s2").got(1, dup=True, subscriber="s2").shared()
    assert report.ok, report.summary()


def test_a_redelivery_needs_every_earlier_member_ended() -> None:
    history = H().sub("s1").sub("s2").sub("s3").pub(1).ack(1)
    history.got(1, subscriber="s1").end("s1").got(1, subscriber="s2").end("s2")
    assert history.got(1, subscriber="s3").shared().redelivered == 2
    history = H().sub("s1").sub("s2").sub("s3").pub(1).ack(1)
    history.got(1, subscriber="s1").end("s1").got(1, subscriber="s2")
    report = history.got(1, subscriber="s3").shared()
    assert (report.redelivered, report.doubled) == (1, 1) and not report.ok


def test_an_ended_member_is_a_new_member_after() -> None:
    """Its next session may be the shard's next owner: it gets the job again, as new."""
    history = H().sub("s1").sub("s2").pub(1).ack(1).got(1, subscriber="s1").end("s1")
    report = history.got(1, subscriber="s1").shared()
    assert report.ok and report.redelivered == 1
    assert report.qos1_duplicates == 0 and report.missing_dup == 0


def test_qos2_jobs_of_an_ended_member_never_go_to_another() -> None:
    history = H().sub("s1").sub("s2").pub(1, qos=2).ack(1).got(1, qos=2, subscriber="s1")
    report = history.end("s1").got(1, qos=2, subscriber="s2").shared()
    assert report.violations() == {"qos2_doubled": 1}


def test_qos2_jobs_an_ended_member_had_not_been_released_are_dropped() -> None:
    history = H().sub("s1").sub("s2").pub(1, qos=2).ack(1).end("s1", dropped=(("p1", 1),))
    report = history.shared()
    assert report.ok, report.summary()
    assert (report.dropped, report.lost) == (1, 0)
    report = history.got(1, qos=2, subscriber="s2").shared()
    assert report.violations() == {"qos2_doubled": 1}
    assert "an ended member dropped (event 6)" in report.examples["qos2_doubled"][0]


def test_an_acknowledged_job_no_member_got_is_lost() -> None:
    report = H().sub("s1").sub("s2").pub(1).ack(1).pub(2).ack(2).got(1, subscriber="s2").shared()
    assert report.violations() == {"lost": 1}
    assert report.lost_messages == [("the group", "p1", 2, 6, 7)]
    assert report.examples["lost"] == [
        "the group never got p1:2 (QoS 1, acknowledged, event 7)"]


def test_a_job_published_before_the_first_member_subscribed_is_not_expected() -> None:
    report = H().pub(1).ack(1).sub("s1").pub(2).ack(2).got(2).shared()
    assert report.ok, report.summary()


def test_a_qos2_job_an_ended_member_may_have_held_unsent_is_allowed() -> None:
    """2 acknowledged, then s1's session ends before any later message of p1 reached a
    member: s1 may have held 2 unsent (its second window)."""
    history = H().sub("s1").sub("s2").pub(1).ack(1).got(1).pub(2, qos=2).ack(2)
    report = history.end("s1").pub(3).ack(3).got(3, subscriber="s2").shared()
    assert report.ok, report.summary()
    assert (report.dropped_unseen, report.lost) == (1, 0)


def test_a_qos2_job_lost_while_later_ones_flowed_is_lost() -> None:
    history = H().sub("s1").sub("s2").pub(1, qos=2).ack(1).pub(2).ack(2).got(2)
    report = history.end("s1").shared()
    assert report.violations() == {"lost": 1} and report.dropped_unseen == 0
    history = H().sub("s1").sub("s2").pub(1, qos=2).ack(1).got(1, qos=2).pub(2, qos=2).ack(2)
    report = history.pub(3).ack(3).got(3, subscriber="s2").shared()  # no session ended
    assert report.violations() == {"lost": 1}


def test_a_qos1_job_is_never_dropped() -> None:
    report = H().sub("s1").sub("s2").pub(1).ack(1).end("s1").shared()
    assert report.violations() == {"lost": 1}


def test_within_a_member_the_duplicate_rules_hold() -> None:
    history = H().sub("s1").sub("s2").pub(1).ack(1).got(1).got(1, dup=True)
    report = history.shared()
    assert report.ok and report.qos1_duplicates == 1
    report = H().sub("s1").pub(1).ack(1).got(1).got(1).shared()
    assert report.violations() == {"missing_dup": 1}
    assert report.examples["missing_dup"] == [
        "s1#1 got p1:1 again without DUP (QoS 1, at n1)"]
    report = H().sub("s1").pub(1, qos=2).ack(1).got(1, qos=2).got(1, qos=2, dup=True).shared()
    assert report.violations() == {"qos2_duplicates": 1}


def test_a_lost_session_of_a_member_is_flagged_but_not_an_ended_one() -> None:
    report = H().sub("s1").end("s1").connect("s1", present=True).shared()
    assert report.ok, report.summary()
    report = H().sub("s1").end("s1").connect("s1", present=False).shared()
    assert report.violations() == {"sessions_lost": 1}


def test_a_job_sent_twice_by_its_publisher_may_reach_two_members() -> None:
    history = H().sub("s1").sub("s2").pub(1, qos=2).fail(1).pub(1, qos=2, conn=2).ack(1, conn=2)
    report = history.got(1, qos=2, subscriber="s1").got(1, qos=2, subscriber="s2").shared()
    assert report.ok, report.summary()
    assert report.resend_doubled == 1
