"""Smoke test of bench/pathcost.py: the in-process harness that changes to the hot path are
judged by must keep delivering through real Connections (and, durable, real LevelDB); a
harness that stalls or stops counting would make every later comparison meaningless."""

import asyncio

import pytest

from bench import pathcost

TIMEOUT = 60.0


@pytest.mark.parametrize("qos", [0, 1])
async def test_memory_path_delivers_and_costs_cpu(qos: int) -> None:
    cost = await asyncio.wait_for(pathcost.measure(qos, 2_000, 32), TIMEOUT)
    assert cost > 0


async def test_durable_path_delivers_every_message_and_costs_cpu() -> None:
    cost = await asyncio.wait_for(pathcost.measure_durable(1_000, 100), TIMEOUT)
    assert cost > 0
