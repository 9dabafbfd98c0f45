"""A latency histogram kept as Prometheus wants it: cumulative bucket counts and a sum.

An fsync's latency is the figure an operator needs to judge the disk (a few hundred
microseconds on a good SSD, tens of milliseconds on a network volume); a scrape needs
counts per bucket, so each observation bumps one counter instead of keeping samples.
"""

from bisect import bisect_left
from typing import Final

BOUNDS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0)


class LatencyHistogram:
    __slots__ = ("_counts", "count", "sum")

    def __init__(self) -> None:
        self._counts = [0] * (len(BOUNDS) + 1)  # the last one: above every bound
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect_left(BOUNDS, seconds)] += 1
        self.count += 1
        self.sum += seconds

    def buckets(self) -> list[tuple[str, float]]:
        """(upper bound, observations at or below it), cumulative, ending with +Inf."""
        result: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip((*map(str, BOUNDS), "+Inf"), self._counts, strict=True):
            total += count
            result.append((bound, float(total)))
        return result
