"""Per-client rate limits: EMQX's rate values, the token buckets, and a Connection that stops
reading while in debt (driven in-process with a fake transport and the real event loop)."""

import asyncio
from pathlib import Path
from typing import Any

import pytest

from broker.config.loader import ConfigError, load_config
from broker.config.values import parse_rate
from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import PropertyId
from broker.mqtt.packets import Connect, Puback, Publish, Subscribe, Subscription
from broker.node import Node
from broker.server.connection import PAUSE_RATE, Connection
from broker.server.output import OutputBatch
from broker.server.ratelimit import ClientRates, TokenBucket
from tests.support.transport import RecordingTransport

V4 = 4


@pytest.mark.parametrize(("raw", "expected"), [
    ("infinity", None), ("Infinity", None), ("1000/s", (1000.0, 1.0)),
    ("10/100ms", (10.0, 0.1)), ("500/10s", (500.0, 10.0)), ("60/m", (60.0, 60.0)),
    (" 2 / s ", (2.0, 1.0)),
])
def test_message_rates(raw: str, expected: tuple[float, float] | None) -> None:
    assert parse_rate(sizes=False)(raw) == expected


@pytest.mark.parametrize(("raw", "expected"), [
    ("1MB/s", (1048576.0, 1.0)), ("64KB/s", (65536.0, 1.0)), ("1000/s", (1000.0, 1.0)),
    ("512b/100ms", (512.0, 0.1)), ("infinity", None),
])
def test_byte_rates(raw: str, expected: tuple[float, float] | None) -> None:
    assert parse_rate(sizes=True)(raw) == expected


def test_zero_is_no_limit_only_where_allowed() -> None:
    """The snapshot throttle takes `0` as off; elsewhere a rate of 0 is refused."""
    assert parse_rate(sizes=True, zero_unlimited=True)("0") is None
    assert parse_rate(sizes=True, zero_unlimited=True)("1MB/s") == (1048576.0, 1.0)
    assert load_config(None, ["durable_storage.raft.snapshot_bytes_rate=0"])[
        "durable_storage.raft.snapshot_bytes_rate"] is None
    with pytest.raises(ValueError, match="rate"):
        parse_rate(sizes=True)("0")


def test_a_snapshot_rate_too_slow_to_finish_a_transfer_is_refused() -> None:
    """Paced chunks are at least 64 KiB (broker/raft/spool.py): slower than 256KB/s, one
    would hold the next back for longer than the Raft core waits for a transfer to move."""
    assert load_config(None, ["durable_storage.raft.snapshot_bytes_rate=256KB/s"])[
        "durable_storage.raft.snapshot_bytes_rate"] == (262144.0, 1.0)
    with pytest.raises(ConfigError, match=r"snapshot_bytes_rate.*at least 256KB/s"):
        load_config(None, ["durable_storage.raft.snapshot_bytes_rate=255KB/s"])
    with pytest.raises(ConfigError, match="at least"):
        load_config(None, ["durable_storage.raft.snapshot_bytes_rate=1MB/10s"])


@pytest.mark.parametrize("raw", ["1000", "0/s", "10/0s", "1MB/s", "x/s", "-1/s", "10/s/s", ""])
def test_bad_message_rates_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(sizes=False)(raw)


def test_a_bad_rate_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"listeners\.ssl\.default\.bytes_rate"):
        load_config(None, ["listeners.ssl.default.bytes_rate=fast"])
    config = load_config(None, ["listeners.ws.default.messages_rate=10/100ms"])
    assert config["listeners.ws.default.messages_rate"] == (10.0, 0.1)
    assert config["listeners.tcp.default.messages_rate"] is None  # infinity by default
    assert config["force_shutdown.max_heap_size"] == 32 * 1024 * 1024


def test_a_bucket_bursts_one_period_then_owes_time_at_the_rate() -> None:
    bucket = TokenBucket((10.0, 0.1), now=0.0)  # 100/s, burst 10
    assert bucket.take(10, 0.0) == 0.0  # the burst
    assert bucket.take(5, 0.0) == pytest.approx(0.05)  # 5 owed at 100/s
    assert bucket.take(0, 0.05) == 0.0  # paid back
    assert bucket.take(1, 10.0) == 0.0  # a long pause refills only up to the burst
    assert bucket.tokens == pytest.approx(9.0)


def test_a_limiter_asks_for_the_longer_pause_and_names_its_limit() -> None:
    rates = ClientRates("tcp", (50.0, 1.0), (1000.0, 1.0))
    limiter = rates.limiter(0.0)
    assert limiter is not None
    assert limiter.charge(0.0, 10, 500) == (0.0, "")
    wait, limit = limiter.charge(0.0, 10, 2500)  # 2000 bytes owed: 2 s; messages: none
    assert (wait, limit) == (pytest.approx(2.0), "tcp.bytes_rate")
    wait, limit = limiter.charge(0.0, 200, 0)  # 170 messages owed: 3.4 s
    assert (wait, limit) == (pytest.approx(3.4), "tcp.messages_rate")
    assert ClientRates("ws", None, None).limiter(0.0) is None


class PausableTransport(RecordingTransport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.pauses = 0

    def pause_reading(self) -> None:
        assert self.reading
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        assert not self.reading
        self.reading = True


def _connected(node: Node, rates: ClientRates) -> tuple[Connection, PausableTransport]:
    transport = PausableTransport()
    output = OutputBatch(asyncio.get_running_loop())
    connection = Connection(node, transport, output, rates)
    connection.data_received(encode(Connect(client_id="limited", protocol_level=V4), V4))
    assert connection.connected
    return connection, transport


async def test_a_connection_above_messages_rate_stops_reading_then_resumes(
        tmp_path: Path) -> None:
    node = Node(load_config(None, [f"node.data_dir={tmp_path}",
                                   "durable_sessions.enable=false"]))
    try:
        connection, transport = _connected(node, ClientRates("tcp", (20.0, 0.1), None))
        burst = b"".join(encode(Publish("t", b"x", qos=0), V4) for _ in range(20))
        connection.data_received(burst)  # the bucket's burst: still read
        assert transport.reading
        connection.data_received(burst)  # 20 owed at 200/s: 100 ms not read
        assert not transport.reading and connection._paused & PAUSE_RATE
        assert node.stats.throttled == {"tcp.messages_rate": 1}
        assert node.stats.messages_received[0] == 40  # handled, nothing dropped
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not transport.reading:
            assert loop.time() - started < 5, "never resumed"
            await asyncio.sleep(0.01)
        assert loop.time() - started >= 0.08
        assert transport.pauses == 1
        connection.close()
    finally:
        node.close()


async def test_no_pause_without_limits_and_none_outlives_a_close(tmp_path: Path) -> None:
    node = Node(load_config(None, [f"node.data_dir={tmp_path}",
                                   "durable_sessions.enable=false"]))
    try:
        free, free_t = _connected(node, ClientRates("tcp", None, None))
        free.data_received(b"".join(encode(Publish("t", b"x" * 100, qos=0), V4)
                                    for _ in range(1000)))
        assert free_t.reading and free._rates is None
        limited, limited_t = _connected(node, ClientRates("tcp", None, (100.0, 1.0)))
        limited.data_received(encode(Publish("t", b"x" * 1000, qos=0), V4))
        assert not limited_t.reading and node.stats.throttled == {"tcp.bytes_rate": 1}
        limited.close()
        assert limited._rate_timer is None  # cancelled: no callback on a closed connection
    finally:
        node.close()


class BufferingTransport(PausableTransport):
    """A socket whose peer reads nothing: `unsent` is what waits in it."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted = False
        self.unsent = 0

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


async def test_a_backlogged_connection_is_closed_when_more_output_is_due(
        tmp_path: Path, caplog: Any) -> None:
    node = Node(load_config(None, [f"node.data_dir={tmp_path}",
                                   "force_shutdown.max_heap_size=1MB"]))
    try:
        transport = BufferingTransport()
        connection = Connection(node, transport, OutputBatch(asyncio.get_running_loop()))
        connection.data_received(encode(Connect(client_id="slow", protocol_level=V4), V4))
        transport.unsent = 2 * 1024 * 1024
        connection.output_backlogged(True)  # the listener's pause_writing
        transport.unsent = 1024 * 1024  # the client read some: at the bound, not past it
        connection.send(b"\xd0\x00")
        connection.flush()
        assert not transport.aborted and transport.writes[-1] == b"\xd0\x00"
        transport.unsent += 1
        connection.send(b"\xd0\x00")
        connection.flush()
        assert transport.aborted and connection.closed
        assert transport.writes[-1] == b"\xd0\x00" and len(transport.writes) == 2
        assert node.stats.refused == {"max_heap_size": 1}
        assert "past force_shutdown.max_heap_size" in caplog.text
    finally:
        node.close()


async def test_a_resumed_session_is_resent_no_more_than_its_new_receive_maximum(
        tmp_path: Path) -> None:
    """Ten QoS 1 messages in flight when the client left; it comes back with Receive
    Maximum 3: three are resent (DUP), the next leaves with its own packet ID once one is
    acknowledged."""
    node = Node(load_config(None, [f"node.data_dir={tmp_path}", "mqtt.max_inflight=100",
                                   "durable_sessions.enable=false"]))
    output = OutputBatch(asyncio.get_running_loop())
    v5 = 5

    def connect(receive_maximum: int, clean: bool,
                client_id: str = "resumed") -> tuple[Connection, RecordingTransport]:
        transport = RecordingTransport()
        connection = Connection(node, transport, output)
        connection.data_received(encode(Connect(
            client_id=client_id, protocol_level=v5, clean_start=clean, properties={
                PropertyId.RECEIVE_MAXIMUM: receive_maximum,
                PropertyId.SESSION_EXPIRY_INTERVAL: 60}), v5))
        return connection, transport

    try:
        first, first_t = connect(100, True)
        first.data_received(encode(Subscribe(1, [Subscription("t", qos=1)]), v5))
        publisher, _ = connect(100, True, "publisher")
        publisher.data_received(b"".join(
            encode(Publish("t", b"%d" % n, qos=1, packet_id=n + 1), v5) for n in range(10)))
        sent = [p for p in Decoder(version=v5).feed(b"".join(first_t.writes))
                if isinstance(p, Publish)]
        assert len(sent) == 10
        first.close()
        first.connection_lost()

        back, back_t = connect(3, False)
        resent = [p for p in Decoder(version=v5).feed(b"".join(back_t.writes))
                  if isinstance(p, Publish)]
        assert [(p.payload, p.packet_id, p.dup) for p in resent] == [
            (s.payload, s.packet_id, True) for s in sent[:3]]
        back_t.writes.clear()
        back.data_received(encode(Puback(resent[0].packet_id), v5))
        more = Decoder(version=v5).feed(b"".join(back_t.writes))
        assert [(p.payload, p.packet_id) for p in more] == [(sent[3].payload,
                                                              sent[3].packet_id)]
    finally:
        node.close()
