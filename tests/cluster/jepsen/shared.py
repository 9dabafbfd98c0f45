"""The shared-subscription workload: the members of one durable shared subscription
(`$share/<group>/jepsen/<run>/#`, each a durable session) share the publishers' messages.

Publishers and members behave as in workload.py (members are its durable subscribers: one
paho object and one client ID each for the whole run, Clean Start 0, reconnecting to random
nodes), and the history is judged by `check_shared` (history.py): every acknowledged message
reaches a member, none reaches two, but QoS 1 deliveries of a member whose session ended.

With `end_sessions`, a member ends its session now and then, when its stay is over, at most
one member at a time and only while every other member holds the subscription (the group
never loses its last member):

1. it stops acknowledging (paho's manual acknowledgements) until it holds as many
   unacknowledged deliveries as its Receive Maximum (a QoS 2 PUBLISH counts from its PUBREC,
   before its PUBREL hands it over), or `hold` seconds passed: its whole window is left
   unacknowledged. (The broker may hold one more window for it, unsent: it goes back to
   the group; but after the member moved nodes, what it holds was replayed and counts as
   maybe sent, and its QoS 2 messages are dropped at the end: the client cannot see them,
   the checker allows for it: `dropped_unseen`.) Should the connection break meanwhile, it
   goes on as before;
2. its connection is reset, the QoS 2 messages it received and was never released are
   recorded with an Ended event (the broker drops them: MQTT-4.8.2-5), and it connects with
   Clean Start 1 (its session ends: its unacknowledged QoS 1 deliveries go to the shard's
   next owner, as new deliveries) and subscribes again, a new member.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from tests.cluster.jepsen.history import Ended, SharedReport, check_shared, parse_payload
from tests.cluster.jepsen.workload import (
    Client,
    Directory,
    Recorder,
    Workload,
    WorkloadConfig,
)


@dataclass
class SharedConfig(WorkloadConfig):
    group: str = "workers"
    end_sessions: float = 0.0  # share of a member's stays that end with its session ending
    receive_maximum: int = 10  # the members' (their in-flight window at the broker)
    hold: float = 2.0  # seconds a member waits for a full window before it ends its session
    n_shards: int = 0  # of the messages database: if known, the publishers' go to different
    # shards (a publisher's messages are in shard crc32(client ID) mod n_shards), so that
    # each member has work


@dataclass
class _Member:
    client: Client
    cond: threading.Condition = field(default_factory=threading.Condition)
    holding: bool = False
    held: list[tuple[int, int]] = field(default_factory=list)  # (mid, qos) not acknowledged


class SharedWorkload(Workload):
    label = "shared"
    config: SharedConfig

    def __init__(self, directory: Directory, recorder: Recorder,
                 config: SharedConfig | None = None, run: str | None = None) -> None:
        super().__init__(directory, recorder, config or SharedConfig(), run)
        self.topic_filter = f"$share/{self.config.group}/{self.prefix}/#"
        self._members: dict[str, _Member] = {}

    def _publisher_id(self, name: str) -> str:
        """With `n_shards`, publisher n's client ID falls into shard n - 1 (mod n_shards)."""
        n_shards = self.config.n_shards
        if not n_shards:
            return super()._publisher_id(name)
        shard = (int(name.lstrip("p")) - 1) % n_shards
        suffix = 0
        while zlib.crc32(f"{self.run}-{name}-{suffix}".encode()) % n_shards != shard:
            suffix += 1
        return f"{self.run}-{name}-{suffix}"

    def durable_filters(self) -> int:
        return min(len(self.homes()), 1)  # a group is one entry, whatever its members

    def pending(self) -> int:
        return self.recorder.missing_from_group()

    def check(self) -> SharedReport:
        return check_shared(self.recorder.snapshot())

    def _probe_arrived(self, marker: bytes, subscribers: set[str]) -> bool:
        return any(marker in self._probes.get(s, set()) for s in subscribers)

    def _subscriber_client(self, name: str, here: dict[str, str], **options: Any) -> Client:
        client = super()._subscriber_client(name, here,
                                            receive_maximum=self.config.receive_maximum)
        self._members[name] = _Member(client)
        return client

    def _handed_over(self, name: str, received: Any) -> None:
        member = self._members[name]
        with member.cond:
            if member.holding:
                member.held.append((received.mid, received.qos))
                member.cond.notify_all()

    def _end_session(self, name: str, client: Client, rng: random.Random,
                     here: dict[str, str]) -> bool:
        config = self.config
        if rng.random() >= config.end_sessions:
            return False
        with self._lock:  # every other member subscribed, and none ending
            if len(self._homes) < max(config.subscribers, 2):
                return False
            home = self._homes.pop(name)
        member, paho = self._members[name], client.paho
        deadline = time.monotonic() + config.hold
        with member.cond:
            member.holding = True
            paho.manual_ack_set(True)

            def full() -> bool:  # paho keeps a QoS 2 PUBLISH there from PUBREC to PUBREL
                return len(member.held) + len(paho._in_messages) >= config.receive_maximum

            while not full() and client.connected and not self._stop_subscribers.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                member.cond.wait(min(remaining, 0.1))  # a PUBLISH of QoS 2 calls no one
            ending = client.connected and not self._stop_subscribers.is_set()
            member.holding = False
            held, member.held = member.held, []
            if not ending and client.connected:  # stopping: what it held is acknowledged,
                for mid, qos in held:  # then DISCONNECT, in this order
                    paho.ack(mid, qos)
        if ending:
            client.abort()
            dropped = tuple(key for message in paho._in_messages.values()
                            if (key := parse_payload(bytes(message.payload))) is not None)
            self.recorder.record(Ended(name, here["node"], dropped))
        else:
            client.disconnect()
            with self._lock:
                self._homes[name] = home
        paho.manual_ack_set(False)  # the loop has stopped: no PUBLISH is being handed over
        return ending

