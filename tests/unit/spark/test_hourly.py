"""The stats job's partial aggregate against a count done by hand: across hours, across
batches, and whether a partition's partials are merged or handed over unmerged."""

import random
from collections import Counter

import pyarrow as pa
import pytest

import hourly

_HOUR = hourly.HOUR_US


def messages(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    start = 1_790_000_000 * 1_000_000 // _HOUR * _HOUR
    return [{
        # both sides of an hour's edge, to the microsecond
        "timestamp_us": start + rng.choice([0, 1, _HOUR - 1, _HOUR, 2 * _HOUR + 7]),
        "topic": f"t/{rng.randrange(4)}", "structure": rng.choice(["t/+", "x"]),
        "publisher": f"p{rng.randrange(3)}", "qos": rng.randrange(3),
        "payload_size": rng.randrange(100),
    } for _ in range(count)]


def by_hand(rows: list[dict]) -> Counter:
    totals: Counter = Counter()
    for r in rows:
        key = (r["timestamp_us"] // _HOUR * _HOUR, r["topic"], r["structure"], r["publisher"])
        for metric, value in (("messages", 1), ("bytes", r["payload_size"]),
                              (f"qos{r['qos']}", 1)):
            totals[(*key, metric)] += value
    return totals


def summed(batches: list[pa.RecordBatch]) -> tuple[Counter, int]:
    """The partials added up (as Spark adds them), and how many rows crossed."""
    totals: Counter = Counter()
    rows = 0
    for batch in hourly.partials(iter(batches)):
        assert batch.schema == hourly.SCHEMA
        rows += batch.num_rows
        for r in batch.to_pylist():
            for metric in hourly.METRICS:
                if r[metric]:
                    totals[(*(r[k] for k in hourly.KEYS), metric)] += r[metric]
    return totals, rows


def as_batches(rows: list[dict], size: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pylist(rows[i:i + size], schema=hourly.READS)
            for i in range(0, len(rows), size)]


@pytest.mark.parametrize("merge_rows", [1 << 20, 500, 5])
def test_partials_add_up_to_the_count_by_hand(monkeypatch, merge_rows: int) -> None:
    """Merged once at the end, merged on the way (500 rows hold every group), or handed
    over unmerged (5 rows hold fewer than the groups: merging does not shrink them)."""
    monkeypatch.setattr(hourly, "_MERGE_ROWS", merge_rows)
    rows = messages(2000, seed=merge_rows)
    totals, crossed = summed(as_batches(rows, 64))
    assert totals == by_hand(rows)
    groups = len({key[:4] for key in by_hand(rows)})
    assert (crossed == groups) if merge_rows >= 500 else (crossed > groups)


def test_no_batches_no_partials() -> None:
    assert list(hourly.partials(iter([]))) == []
