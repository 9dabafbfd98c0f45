"""One broker node: the router, the sessions and the retainer, and how a message moves.

This is the seam between protocol handling (connections) and state; everything that
reaches more than one client goes through `publish`.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.config.loader import Config
from broker.ds import DurableStorage, Settings
from broker.metrics import Stats
from broker.mqtt.topic import parse_shared
from broker.retainer.store import RetainedStore
from broker.routing.router import Router
from broker.session.manager import SessionManager
from broker.session.message import Message
from broker.session.session import Session


@dataclass(frozen=True, slots=True)
class PublishLimits:
    """The settings checked on every PUBLISH, read once: a Config lookup per packet shows up
    in profiles."""

    max_qos: int
    retain_available: bool
    max_topic_levels: int
    max_topic_alias: int
    max_inflight: int
    max_awaiting_rel: int

    @classmethod
    def from_config(cls, config: Config) -> "PublishLimits":
        return cls(
            config["mqtt.max_qos_allowed"], config["mqtt.retain_available"],
            config["mqtt.max_topic_levels"], config["mqtt.max_topic_alias"],
            config["mqtt.max_inflight"], config["mqtt.max_awaiting_rel"],
        )


class Node:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.limits = PublishLimits.from_config(config)
        self.stats = Stats()
        self.router = Router()
        self.connections: set[Any] = set()
        self.retainer: RetainedStore | None = None
        if config["retainer.enable"]:
            self.retainer = RetainedStore(
                Path(config["node.data_dir"]) / "retained",
                config["retainer.max_retained_messages"],
                config["retainer.max_payload_size"],
                config["retainer.expiry_interval"],
            )
        # Durable Storage: opened here, its timers started and its buffers flushed by BrokerApp.
        self.ds: DurableStorage | None = None
        if config["durable_sessions.enable"]:
            self.ds = DurableStorage(Path(config["node.data_dir"]), Settings.from_config(config))
        self.sessions = SessionManager(
            self.publish, self._forget_subscriptions,
            config["mqtt.max_mqueue_len"], config["mqtt.mqueue_store_qos0"],
        )

    def publish(self, message: Message) -> int:
        """Stores if retained, then hands the message to every matching session."""
        if message.retain and self.retainer is not None and not self.retainer.put(message):
            self.stats.drop("retained_limit")
        deliveries = self.router.route(message, self._is_online)
        sessions = self.sessions.sessions
        for client_id, delivery in deliveries.items():
            session = sessions[client_id]
            connection = session.connection
            if connection is not None:
                connection.deliver(delivery)
            else:
                lost = session.enqueue(delivery)
                if lost:
                    self.stats.drop(lost)
        if not deliveries:
            self.stats.drop("no_subscribers")
        return len(deliveries)

    def _is_online(self, client_id: str) -> bool:
        session = self.sessions.sessions.get(client_id)
        return session is not None and session.connection is not None

    def _forget_subscriptions(self, session: Session) -> None:
        dropped = len(session.queue)
        if dropped:
            self.stats.drop("session_ended", dropped)
        for key, options in session.subscriptions.items():
            _, topic_filter = parse_shared(key)
            self.router.unsubscribe(session.client_id, topic_filter, options.share_group)
        session.subscriptions.clear()

    def gauges(self) -> dict[str, tuple[str, float]]:
        sessions = self.sessions.sessions.values()
        return {
            "mqtt_connections": ("Connected clients", len(self.connections)),
            "mqtt_sessions": ("Sessions, connected or not", len(self.sessions.sessions)),
            "mqtt_subscriptions": ("Subscriptions", len(self.router)),
            "mqtt_retained_messages": (
                "Retained messages stored", len(self.retainer) if self.retainer else 0
            ),
            "mqtt_inflight": ("Deliveries awaiting acknowledgement",
                              sum(len(s.inflight) for s in sessions)),
            "mqtt_queued": ("Messages queued in sessions", sum(len(s.queue) for s in sessions)),
        }

    def close(self) -> None:
        self.sessions.close_all()
        if self.retainer is not None:
            self.retainer.close()
