"""Durable Storage settings, read once from the broker's configuration.

The library takes this plain object rather than the broker's Config so that tools (the
offline `ctl ds info`, benchmarks, tests) can open a storage without a broker around it.
"""

from collections.abc import Mapping
from typing import Any, NamedTuple


class Settings(NamedTuple):
    n_shards: int = 16
    replication_factor: int = 3
    wildcard_thresholds: tuple[int, ...] = (100, 10)
    flush_interval: float = 0.010
    max_items: int = 1000
    idle_flush_interval: float = 0.001
    generation_interval: float = 3600.0
    generation_max_size: int = 1 << 30
    max_open_slabs: int = 64
    compression: str = "none"
    retention_period: float = 86400.0
    storage_quota: int = 0  # bytes of the messages database on this node; 0: none
    site_id: str = ""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Settings":
        prefix = "durable_storage.messages."
        return cls(
            n_shards=config[prefix + "n_shards"],
            replication_factor=config[prefix + "replication_factor"],
            wildcard_thresholds=tuple(config[prefix + "layout.wildcard_thresholds"]),
            flush_interval=config[prefix + "flush_interval"],
            max_items=config[prefix + "max_items"],
            idle_flush_interval=config[prefix + "idle_flush_interval"],
            generation_interval=config[prefix + "generation_interval"],
            generation_max_size=config[prefix + "generation_max_size"],
            max_open_slabs=config[prefix + "max_open_slabs"],
            compression=config[prefix + "compression"],
            retention_period=config["durable_sessions.message_retention_period"],
            storage_quota=config[prefix + "storage_quota"],
            site_id=config["node.site_id"],
        )

    @property
    def leveldb_compression(self) -> str | None:
        return None if self.compression == "none" else self.compression

    @property
    def buffer(self) -> tuple[float, int, float]:
        return self.flush_interval, self.max_items, self.idle_flush_interval
