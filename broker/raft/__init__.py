"""Raft: a sans-I/O consensus core (core.py), one write-ahead log per node for all its groups
(wal.py), the node that drives both without I/O (host.py) and its asyncio shell (node.py)."""
