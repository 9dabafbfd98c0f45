"""Imported at start-up by the broker process that tests/fuzz/test_network_fuzz.py starts
with this folder on PYTHONPATH: every 200th PUBLISH handled raises, as a handler bug would,
so that the test can show the fuzzer notices one."""

import itertools
from typing import Any

from broker.mqtt.constants import PacketType
from broker.server import handlers

_handle_publish = handlers.HANDLERS[PacketType.PUBLISH]
_count = itertools.count(1)


def _sometimes_crashes(conn: Any, packet: Any) -> None:
    if next(_count) % 200 == 0:
        raise RuntimeError("injected handler bug")
    _handle_publish(conn, packet)


handlers.HANDLERS[PacketType.PUBLISH] = _sometimes_crashes
