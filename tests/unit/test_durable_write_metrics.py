"""mqtt_durable_write_seconds and mqtt_durable_write_errors_total: one observation per batch
future (however many messages share it), failures counted apart, a stop not counted."""

import asyncio

from prometheus_client import generate_latest

from broker.metrics import make_registry
from broker.stats import WRITE_BUCKETS, Stats


def _scrape(stats: Stats) -> dict[str, float]:
    text = generate_latest(make_registry(stats, dict)).decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("mqtt_durable_write")}


def test_a_batch_is_timed_once_and_a_failure_is_an_error() -> None:
    async def run() -> Stats:
        stats = Stats()
        loop = asyncio.get_running_loop()
        stored, failed, stopped = (loop.create_future() for _ in range(3))
        for future in (stored, stored, stored, failed, stopped):  # three messages, one batch
            stats.durable_writes.watch(future)
        stored.set_result(None)
        failed.set_exception(OSError("disk full"))
        stopped.cancel()
        await asyncio.sleep(0)  # done callbacks run on the next loop iteration
        return stats

    samples = _scrape(asyncio.run(run()))
    assert samples["mqtt_durable_write_seconds_count"] == 1
    assert samples['mqtt_durable_write_seconds_bucket{le="+Inf"}'] == 1
    assert samples[f'mqtt_durable_write_seconds_bucket{{le="{WRITE_BUCKETS[-1]}"}}'] == 1
    assert samples["mqtt_durable_write_errors_total"] == 1

